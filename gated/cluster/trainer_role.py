"""`gated run --role trainer`: the one learning brain of a fleet (docs/cluster.md).

The single-host daemon (its socket, its trainer process, its LMDB), plus:
- one durable pull consumer on the signal stream: each fetched batch is validated,
  group-committed to the LMDB log (de-duplicated by signal id) and only then acked, so
  a message is never acked before it is durable here, and a redelivery (after a crash
  between the commit and the ack) is stored and trained once;
- each version the trainer process publishes goes to the Object Store (named by
  version, with its digest and layout fingerprint: snapshot.py) and then the KV key
  `current` names it; the newest `keep_snapshots` objects are kept.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from typing import Any

import msgpack
from nats.js import api as js_api

from ..daemon.server import Daemon
from ..signals import SignalError, validate_signal
from ..store import StoreError
from .metrics import ClusterMetrics
from .nats import (
    CURRENT_KEY,
    NatsRole,
    connect,
    ensure_buckets,
    ensure_stream,
    node_name,
    retry,
    snapshot_chunk_size,
)
from .snapshot import encode, layout_fingerprint, object_name

log = logging.getLogger("gated.cluster")


class TrainerDaemon(NatsRole, Daemon):
    role = "trainer"

    async def _start_role(self) -> None:
        self.cm = ClusterMetrics(self.metrics.registry, "trainer")
        self.cm.connected.set(0)
        self.layout = layout_fingerprint(self.serving.cfg)
        self._loop = asyncio.get_running_loop()
        self._role_stop = asyncio.Event()
        self._publish_wake = asyncio.Event()
        self._nc = None
        self._connected = False
        self._kv_version: int | None = None
        self._consumed = 0
        self._consuming = False  # the durable consumer is bound
        self._role_task = asyncio.create_task(self._run_cluster())

    def on_trainer_message(self, name: str, payload: Any) -> None:
        super().on_trainer_message(name, payload)
        if name == "swap":
            self._loop.call_soon_threadsafe(self._publish_wake.set)

    def _on_nats(self, up: bool) -> None:
        self._connected = up
        self.cm.connected.set(1 if up else 0)

    async def _run_cluster(self) -> None:
        cfg, stop = self.cfg.cluster, self._role_stop
        self._nc = nc = await retry("connect", lambda: connect(cfg, "trainer",
                                                               self._on_nats), stop)
        if nc is None:
            return
        js = nc.jetstream(timeout=5.0)
        await retry("stream", lambda: ensure_stream(js, cfg), stop)
        got = await retry("buckets", lambda: ensure_buckets(js, cfg), stop)
        if got is None:
            return
        kv, obs = got
        await asyncio.gather(self._consume(js), self._publisher(kv, obs))

    # --- signals: JetStream -> LMDB, ack after the commit ------------------------------------
    async def _subscribe(self, js):
        cfg = self.cfg.cluster
        consumer = js_api.ConsumerConfig(
            durable_name=cfg.consumer, name=cfg.consumer, filter_subject=cfg.subject,
            # explicit acks: a work-queue stream requires them
            ack_policy=js_api.AckPolicy.EXPLICIT, ack_wait=cfg.ack_wait_s,
            deliver_policy=js_api.DeliverPolicy.ALL,
            max_ack_pending=max(4 * cfg.fetch_batch, 1000))
        await js.add_consumer(cfg.stream, consumer)  # creates, or updates ack_wait
        return await js.pull_subscribe_bind(durable=cfg.consumer, stream=cfg.stream,
                                            pending_msgs_limit=8 * cfg.fetch_batch)

    async def _consume(self, js) -> None:
        from nats.errors import TimeoutError as NatsTimeout

        cfg, stop = self.cfg.cluster, self._role_stop
        psub = None
        failures = 0
        while not stop.is_set():
            try:
                if psub is None:
                    psub = await self._subscribe(js)
                    self._consuming = True
                    log.info("trainer: consuming %s as durable %s", cfg.stream, cfg.consumer)
                msgs = await psub.fetch(cfg.fetch_batch, timeout=1.0)
                failures = 0
            except (NatsTimeout, TimeoutError):
                continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - NATS down or restarting
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("trainer: fetch failed (%s: %s); retrying", type(e).__name__,
                                e)
                if failures >= 5 and psub is not None:
                    try:
                        await psub.unsubscribe()
                    except Exception:  # noqa: BLE001
                        pass
                    psub = None
                await asyncio.sleep(min(1.0, 0.1 * failures))
                continue
            if msgs:
                await self._commit_and_ack(msgs)

    async def _commit_and_ack(self, msgs: list) -> None:
        signals, good = [], []
        for m in msgs:
            try:
                s = validate_signal(msgpack.unpackb(m.data), self.cfg.limits)
                if not s.get("id"):
                    raise SignalError("missing_field", "a cluster signal carries its id")
            except (SignalError, ValueError, TypeError, msgpack.UnpackException) as e:
                log.error("trainer: terminating an invalid message (seq %s): %s",
                          m.metadata.sequence.stream if m.reply else "?", e)
                self.cm.consumed.labels(result="invalid").inc()
                await m.term()
                continue
            signals.append(s)
            good.append(m)
        if not signals:
            return
        try:
            acks = await self.committer.submit_async(signals)
        except StoreError as e:
            log.error("trainer: storing %d signals failed (%s); JetStream redelivers them",
                      len(signals), e)
            for m in good:
                await m.nak(delay=2.0)
            await asyncio.sleep(1.0)
            return
        for m in good:  # only now: the LMDB transaction has committed
            await m.ack()
        dups = sum(1 for _, dup in acks if dup)
        self.cm.consumed.labels(result="stored").inc(len(acks) - dups)
        if dups:
            self.cm.consumed.labels(result="duplicate").inc(dups)
        self._consumed += len(acks)
        self.metrics.received(len(acks) - dups)
        self.supervisor.wake()

    # --- snapshots: LMDB -> Object Store + KV -------------------------------------------------
    def _encode_current(self) -> tuple[bytes, dict] | None:
        got = self.store.load_published_head()  # head and weights of one version
        if got is None:
            return None
        version, flat, info = got
        return encode(version, flat, step=int(info.get("step", 0)),
                      calibration=info.get("calibration"), layout=self.layout)

    async def _publisher(self, kv, obs) -> None:
        loop = asyncio.get_running_loop()
        kept: deque[str] = deque()
        try:
            cur = json.loads((await kv.get(CURRENT_KEY)).value)
            self._kv_version = int(cur["version"])
        except Exception:  # noqa: BLE001 - nothing published yet
            pass
        self._publish_wake.set()
        while not self._role_stop.is_set():
            try:
                await asyncio.wait_for(self._publish_wake.wait(), timeout=1.0)
            except TimeoutError:
                pass
            self._publish_wake.clear()
            info = await loop.run_in_executor(None, self.store.published_info)
            if info is None or int(info["version"]) == self._kv_version:
                continue
            got = await loop.run_in_executor(None, self._encode_current)
            if got is None:
                continue
            blob, pointer = got
            try:
                chunk = snapshot_chunk_size(self._nc.max_payload)
                await obs.put(pointer["object"], blob, meta=js_api.ObjectMeta(
                    name=pointer["object"],
                    options=js_api.ObjectMetaOptions(max_chunk_size=chunk)))
                await kv.put(CURRENT_KEY, json.dumps(pointer).encode())
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - NATS down: the next wake retries
                log.warning("trainer: publishing version %d failed (%s: %s); retrying",
                            pointer["version"], type(e).__name__, e)
                await asyncio.sleep(0.5)
                self._publish_wake.set()
                continue
            self._kv_version = pointer["version"]
            self.cm.snapshots_published.inc()
            self.cm.trainer_version.set(pointer["version"])
            log.info("trainer: published version %d to the cluster (%d bytes, %.0f ms)",
                     pointer["version"], len(blob),
                     (time.time() - pointer["published_at"]) * 1e3)
            kept.append(pointer["object"])
            while len(kept) > self.cfg.cluster.keep_snapshots:
                old = kept.popleft()
                try:
                    await obs.delete(old)
                except Exception as e:  # noqa: BLE001 - gone already
                    log.debug("trainer: deleting %s: %s", old, e)

    def status(self) -> dict[str, Any]:
        st = super().status()
        st["role"] = "trainer"
        st["cluster"] = {"role": "trainer", "node": node_name(self.cfg.cluster),
                         "nats_connected": self._connected and self._consuming,
                         "cluster_version": self._kv_version,
                         "consumed": self._consumed,
                         "object": object_name(self._kv_version)
                         if self._kv_version is not None else None}
        return st
