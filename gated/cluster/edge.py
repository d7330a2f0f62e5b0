"""`gated run --role edge`: the daemon on a gateway host (docs/cluster.md).

The same socket protocol as the single-host daemon. A signal is acknowledged only after
JetStream acknowledged its publish (file storage, `Nats-Msg-Id` = the signal's id), so
an ack means "stored by the broker"; when JetStream does not answer within
`cluster.publish_timeout_s` (NATS down, a restart) the request is refused with
`overloaded` and the client resends (with ids, a resend is stored once). There is no
trainer here: predictions are served from the newest snapshot the trainer published.
The edge watches the KV key that names it, fetches the object, verifies it (digest,
layout, pointer), keeps it in its own LMDB (a restart serves it at once), warms it up
and swaps; a corrupt or partial object is refused and the old snapshot keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

import msgpack

from ..daemon.ops import Refused
from ..daemon.server import Daemon
from ..daemon.serving import Calibration, Snapshot
from ..engine.tokenizer import source_batch
from .metrics import ClusterMetrics
from .nats import (
    CURRENT_KEY,
    NatsRole,
    connect,
    ensure_buckets,
    ensure_stream,
    fetch_object,
    node_name,
    retry,
)
from .snapshot import SnapshotError, decode, layout_fingerprint

log = logging.getLogger("gated.cluster")


class NoTrainer:
    """An edge trains nothing: the supervisor seam, empty."""

    status = None
    pid = None
    restarts = 0

    def start(self) -> None: ...
    def wake(self) -> None: ...
    def update(self, train: Any, retention: Any) -> None: ...

    def alive(self) -> bool:
        return False

    def stop(self, timeout: float) -> None:
        return None


class JetStreamCommitter:
    """The edge's committer: `submit` resolves with [(stream seq, duplicate)] once
    JetStream acknowledged every signal, or raises Refused("overloaded")."""

    def __init__(self, edge: EdgeDaemon) -> None:
        self.edge = edge
        self.js = None
        self.connected = False
        self.closed = False
        self.prefix = f"{node_name(edge.cfg.cluster)}-"

    def set_weights(self, table: Any) -> None:
        """Labels and weights are the trainer's business (it commits the signals)."""

    def close(self) -> None:
        self.closed = True

    def submit_async(self, signals: list[dict]) -> asyncio.Future:
        """The daemon's ingest awaits this (as `GroupCommitter.submit_async`)."""
        return asyncio.ensure_future(self._publish(list(signals)))

    def _refuse(self, n: int, why: str) -> Refused:
        self.edge.cm.published.labels(result="refused").inc(n)
        return Refused("overloaded", f"{why}; the signals were NOT acknowledged: resend "
                       "them with backoff (a resend with the same id is stored once)")

    async def _publish(self, signals: list[dict]) -> list[tuple[int, bool]]:
        cfg = self.edge.cfg.cluster
        js = self.js
        if js is None or not self.connected or self.closed:
            raise self._refuse(len(signals), "this edge is not connected to NATS JetStream")
        t0 = time.perf_counter()
        futs: list[asyncio.Future] = []

        async def send_all() -> list:
            for s in signals:
                sid = s.get("id") or self.prefix + uuid.uuid4().hex
                msg = dict(s)
                msg["id"] = sid
                # wait_stall None: no task per publish (the whole send is bounded below)
                futs.append(await js.publish_async(cfg.subject, msgpack.packb(msg),
                                                   headers={"Nats-Msg-Id": sid}))
            return await asyncio.gather(*futs)

        try:
            acks = await asyncio.wait_for(send_all(), cfg.publish_timeout_s)
        except Exception as e:  # noqa: BLE001 - timeout, disconnect, JetStream error
            for f in futs:
                f.cancel()  # frees nats-py's in-flight slot
            log.warning("JetStream did not acknowledge %d signal(s): %s: %s", len(signals),
                        type(e).__name__, e)
            raise self._refuse(len(signals), f"JetStream did not acknowledge them within "
                               f"{cfg.publish_timeout_s:g}s ({type(e).__name__})") from None
        dups = sum(1 for a in acks if a.duplicate)
        cm = self.edge.cm
        cm.published.labels(result="acked").inc(len(acks) - dups)
        if dups:
            cm.published.labels(result="duplicate").inc(dups)
        cm.publish_seconds.observe(time.perf_counter() - t0)
        return [(int(a.seq), bool(a.duplicate)) for a in acks]


class EdgeDaemon(NatsRole, Daemon):
    role = "edge"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ops["rollback"] = self._op_on_trainer
        self.ops["resume"] = self._op_on_trainer
        self._pointer: dict | None = None     # the newest KV value seen
        self._refused: set[int] = set()       # KV revisions refused
        self._installs = 0
        self._last_install: dict | None = None

    async def _op_on_trainer(self, req: Any) -> dict:
        raise Refused("invalid_value", f"{req.op} is done on the trainer host (gated "
                      "rollback/resume against its socket); edges follow its versions")

    # --- the roles' seams ----------------------------------------------------------------
    def _make_committer(self) -> JetStreamCommitter:
        return JetStreamCommitter(self)

    def _make_supervisor(self) -> NoTrainer:
        return NoTrainer()

    async def _start_role(self) -> None:
        self.cm = ClusterMetrics(self.metrics.registry, "edge")
        self.cm.connected.set(0)
        self.layout = layout_fingerprint(self.serving.cfg)
        self._role_stop = asyncio.Event()
        self._wanted = asyncio.Event()
        self._nc = None
        self._role_task = asyncio.create_task(self._run_cluster())

    def _on_nats(self, up: bool) -> None:
        self.committer.connected = up
        self.cm.connected.set(1 if up else 0)

    async def _run_cluster(self) -> None:
        cfg, stop = self.cfg.cluster, self._role_stop
        self._nc = nc = await retry("connect", lambda: connect(cfg, "edge", self._on_nats),
                                    stop)
        if nc is None:
            return
        js = nc.jetstream(timeout=max(2.0, cfg.publish_timeout_s))
        if await retry("stream", lambda: ensure_stream(js, cfg), stop) is None and \
                stop.is_set():
            return
        got = await retry("buckets", lambda: ensure_buckets(js, cfg), stop)
        if got is None:
            return
        kv, obs = got
        self.committer.js = js
        log.info("edge %s: signals to stream %s, snapshots from %s/%s",
                 node_name(cfg), cfg.stream, cfg.kv_bucket, cfg.object_bucket)
        await asyncio.gather(self._watch(kv), self._installer(obs))

    # --- snapshots -------------------------------------------------------------------------
    def _offer(self, value: bytes | None, revision: int | None) -> None:
        if not value:
            return
        try:
            pointer = json.loads(value)
            int(pointer["version"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring an unreadable %s value: %r", CURRENT_KEY, value[:80])
            return
        pointer["_revision"] = revision
        self._pointer = pointer
        self.cm.trainer_version.set(pointer["version"])
        self._update_lag()
        self._wanted.set()

    def _update_lag(self) -> None:
        if self._pointer is not None:
            self.cm.version_lag.set(int(self._pointer["version"])
                                    - self.serving.current.version)

    async def _watch(self, kv) -> None:
        """The KV watch, and a poll every `poll_s` beside it (a watch can miss an update
        across a reconnect)."""
        from nats.errors import TimeoutError as NatsTimeout

        poll = self.cfg.cluster.poll_s
        while not self._role_stop.is_set():
            try:
                watcher = await kv.watch(CURRENT_KEY)
                while not self._role_stop.is_set():
                    try:
                        entry = await watcher.updates(timeout=poll)
                        if entry is not None:
                            self._offer(entry.value, entry.revision)
                            continue
                    except (NatsTimeout, TimeoutError):
                        pass
                    try:
                        entry = await kv.get(CURRENT_KEY)
                        self._offer(entry.value, entry.revision)
                    except Exception:  # noqa: BLE001 - nothing published yet, NATS down
                        pass
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - re-create the watch
                log.warning("KV watch failed (%s: %s); re-creating it", type(e).__name__, e)
                await asyncio.sleep(min(poll, 1.0))

    async def _installer(self, obs) -> None:
        while not self._role_stop.is_set():
            await self._wanted.wait()
            self._wanted.clear()
            p = self._pointer
            if p is None or int(p["version"]) == self.serving.current.version \
                    or p["_revision"] in self._refused:
                continue
            try:
                await self._install(obs, p)
            except asyncio.CancelledError:
                raise
            except SnapshotError as e:
                self._refused.add(p["_revision"])  # not again (a re-put is a new revision)
                self.cm.snapshots.labels(result="refused").inc()
                log.error("refused snapshot version %s (%s): %s; still serving version %d",
                          p["version"], p.get("object"), e, self.serving.current.version)
            except Exception as e:  # noqa: BLE001 - object gone (a newer one), NATS down
                log.warning("fetching snapshot version %s failed (%s: %s); retrying",
                            p["version"], type(e).__name__, e)
                await asyncio.sleep(0.5)
                self._wanted.set()

    async def _install(self, obs, p: dict) -> None:
        from nats.js.errors import DigestMismatchError

        t0 = time.perf_counter()
        try:
            blob = await asyncio.wait_for(fetch_object(
                self.committer.js, obs, self.cfg.cluster.object_bucket, p["object"]), 60)
        except DigestMismatchError as e:
            raise SnapshotError("the object's chunks do not match its Object Store "
                                "digest (partial or corrupted)") from e
        loop = asyncio.get_running_loop()
        d = await loop.run_in_executor(None, decode, memoryview(blob), p, self.layout)
        cal = Calibration(*d.calibration) if d.calibration else None

        def build() -> Snapshot:
            # Kept in this edge's LMDB first: a restart serves it at once, and the
            # daemon's own store check finds nothing newer to swap back to.
            self.store.publish(d.version, d.flat, step=d.step, keep=2,
                               extra={"calibration": list(d.calibration)
                                      if d.calibration else None})
            snap = Snapshot.of(self.serving.cfg, d.flat, d.version, d.step,
                               self.serving.backend)
            snap.logits(source_batch([("warm-up", None)], self.serving.cfg))  # warm up
            return snap

        snap = await loop.run_in_executor(None, build)
        if self.serving.current.version != d.version:
            # What Serving.swap does, with the snapshot already built and warmed up.
            if cal is not None:
                self.serving.calibration = cal
                self.metrics.allow_band_open.set(float(bool(cal.allow_open)))
            self.serving.current = snap
            self.serving.cache.clear()
            self.metrics.swapped(d.version)
        self._installs += 1
        now = time.time()
        lag_s = max(0.0, now - float(p.get("published_at", now)))
        self.cm.propagation.observe(lag_s)
        self.cm.snapshots.labels(result="installed").inc()
        self._update_lag()
        self._last_install = {"version": d.version, "at": now, "propagation_s": lag_s,
                              "fetch_verify_s": time.perf_counter() - t0}
        log.info("serving snapshot version %d (%.0f ms after its publish)", d.version,
                 lag_s * 1e3)

    # --- status ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        st = super().status()
        st["role"] = "edge"
        serving = self.serving.current.version
        trainer = int(self._pointer["version"]) if self._pointer else None
        st["cluster"] = {
            "role": "edge", "node": node_name(self.cfg.cluster),
            # connected, and the stream and buckets are there: signals are taken
            "nats_connected": bool(self.committer.connected and self.committer.js),
            "serving_version": serving, "trainer_version": trainer,
            "version_lag": None if trainer is None else trainer - serving,
            "installs": self._installs, "refused": len(self._refused),
            "last_install": self._last_install}
        return st
