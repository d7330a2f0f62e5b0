"""kill -9 at random moments loses nothing acknowledged (real child processes, real LMDB).

The children come from a fork server (tests/helpers_store_child.py) that never opens LMDB
itself; each child opens its own Store. The parent SIGKILLs a child at a random moment,
then opens the state like a restarted daemon would and checks it.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers_store_child import CKPT_N, signal_for

from gated.store import Store, load_published
from gated.store.env import close_readers, current

HELPER = Path(__file__).with_name("helpers_store_child.py")
# DESIGN.md's 100-cycle target: GATED_CRASH_ROUNDS=100 (or more) runs a longer campaign.
SIGNAL_ROUNDS = int(os.environ.get("GATED_CRASH_ROUNDS", "50"))
CHECKPOINT_ROUNDS = max(25, SIGNAL_ROUNDS // 2)


class Zygote:
    """Client of the fork server: start a child, kill it, collect what it printed."""

    def __init__(self) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, str(HELPER), "zygote"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     bufsize=0, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.decode())
        self.lines.put(None)

    def _next(self, timeout: float = 30.0) -> str:
        line = self.lines.get(timeout=timeout)
        if line is None:
            raise AssertionError("the fork server died; see the captured stderr")
        return line

    def start(self, cmd: dict) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        line = self._next()
        assert line.startswith("pid "), line
        return int(line.split()[1])

    def finish(self, pid: int, timeout: float = 30.0) -> tuple[list[str], int]:
        """Lines the child printed and its wait status, once it is gone."""
        out = []
        while True:
            line = self._next(timeout)
            if line.startswith(f"exit {pid} "):
                return out, int(line.split()[2])
            out.append(line)

    def run_and_kill(self, cmd: dict, after: float) -> list[str]:
        pid = self.start(cmd)
        time.sleep(after)
        try:
            os.kill(pid, signal.SIGKILL)  # a zombie until the server reaps it: not reused
        except ProcessLookupError:
            pass  # it already ended on its own: reported below
        lines, status = self.finish(pid)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
            f"child ended on its own (status {status}) instead of being killed: {lines[-3:]}")
        return lines

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


def _content(rec: dict) -> dict:
    return {k: rec[k] for k in ("context", "decision", "reason", "history")}


def _expected(sid: str) -> dict:
    s = signal_for(sid)
    return {"context": s["context"], "decision": s["decision"], "reason": s["reason"],
            "history": s["history"]}


@pytest.mark.slow
def test_kill9_loses_no_acknowledged_signal(tmp_path, zygote):
    state = str(tmp_path / "state")
    rnd = random.Random(20240601)
    acked: dict[int, str] = {}
    seq_of: dict[str, int] = {}
    resend: str | None = None
    dup_checks = 0
    for r in range(SIGNAL_ROUNDS):
        # a tiny starting map: the children grow it while being killed
        lines = zygote.run_and_kill({"mode": "signals", "dir": state, "round": r,
                                     "resend": resend, "map_size": 64 * 1024},
                                    after=rnd.uniform(0.005, 0.05))
        this_round: list[tuple[int, str]] = []
        for line in lines:
            kind, *rest = line.split()
            if kind == "ack":
                seq, sid, dup = int(rest[0]), rest[1], int(rest[2])
                assert dup == 0, f"fresh id {sid} reported as duplicate"
                assert seq not in acked, f"seq {seq} acknowledged twice ({acked[seq]}, {sid})"
                acked[seq] = sid
                seq_of[sid] = seq
                this_round.append((seq, sid))
            elif kind == "dup":
                sid, seq, dup = rest[0], int(rest[1]), int(rest[2])
                assert dup == 1 and seq == seq_of[sid], "a re-sent id must get its first seq"
                dup_checks += 1
        if this_round:
            resend = this_round[0][1]
        # restart: the env opens, every acknowledged signal is there, no gaps
        with Store(state) as s:
            last = s.last_seq()
            assert s.count_signals() == last and s.first_seq() == (1 if last else 0)
            for seq, sid in this_round:
                got = s.read_signals(seq - 1, 1)
                assert got and got[0][0] == seq, f"acknowledged seq {seq} lost in round {r}"
                rec = got[0][1]
                assert rec["id"] == sid and _content(rec) == _expected(sid)
    assert len(acked) >= 3 * SIGNAL_ROUNDS, f"only {len(acked)} acks: the children barely ran"
    assert dup_checks >= SIGNAL_ROUNDS // 2
    with Store(state) as s:
        log = s.read_signals(0, 10**9)
        seqs = [seq for seq, _ in log]
        assert seqs == list(range(1, len(log) + 1)), "gaps or duplicates in the log"
        ids = [rec["id"] for _, rec in log]
        assert len(ids) == len(set(ids)), "an id was stored twice"
        by_seq = dict(log)
        for seq, sid in acked.items():
            assert by_seq[seq]["id"] == sid
        assert s.map_size() > 64 * 1024


@pytest.mark.slow
def test_kill9_checkpoint_is_always_one_step(tmp_path, zygote):
    state = str(tmp_path / "state")
    rnd = random.Random(7)
    last_ckpt = last_pub = 0
    r = 0
    # at least CHECKPOINT_ROUNDS kills; more (up to 4x) where a slow machine's children
    # acknowledged fewer checkpoints than that by then (23 of 25 on a 2-core VM whose BLAS
    # probe ran at ~2/3 of the usual speed): the kill moments stay the same random draws,
    # and the floor below still says the children got far enough for the test to prove
    # something
    while r < CHECKPOINT_ROUNDS or (last_ckpt < CHECKPOINT_ROUNDS
                                    and r < 4 * CHECKPOINT_ROUNDS):
        r += 1
        # pieces of 64 KiB: each 200 KB array takes 4 write transactions, then the head's
        lines = zygote.run_and_kill({"mode": "checkpoints", "dir": state,
                                     "map_size": 256 * 1024, "piece_bytes": 64 * 1024},
                                    after=rnd.uniform(0.005, 0.05))
        for line in lines:
            kind, n = line.split()
            if kind == "ckpt":
                last_ckpt = max(last_ckpt, int(n))
            elif kind == "pub":
                last_pub = max(last_pub, int(n))
        with Store(state) as s:
            c = s.load_checkpoint(layout=[("w", (CKPT_N,))], config_fingerprint="crash-test")
            if c is None:
                assert last_ckpt == 0, "an acknowledged checkpoint vanished"
                continue
            k = c.step
            assert k >= last_ckpt, f"round {r}: acknowledged step {last_ckpt}, loaded {k}"
            for name, arr, factor in (("flat", c.flat, 1), ("m", c.m, 2), ("v", c.v, 3),
                                      ("fisher", c.ewc["fisher"], 1),
                                      ("anchor", c.ewc["anchor"], 4)):
                assert np.all(arr == k * factor), f"{name} is not from step {k}"
            assert c.last_trained_seq == 10 * k and c.extra == {"step": k}
            published = s.load_published()
            if last_pub:
                assert published is not None and published[0] >= last_pub
            if published is not None:
                assert np.all(published[1] == published[0]), "torn published snapshot"
            last_ckpt = k
    assert last_ckpt >= CHECKPOINT_ROUNDS, "the children barely ran; the test proved little"


@pytest.mark.slow
def test_published_snapshot_is_consistent_while_another_process_writes(tmp_path, zygote):
    state = tmp_path / "state"
    n = 100_000
    with Store(state, map_size=512 * 1024) as s:
        s.publish(1, np.full(n, 1, np.float32), step=1)
    try:
        assert load_published(state)[0] == 1  # a read-only env with the small map
        reader = current(state)
        assert reader is not None and reader.readonly
        remaps = reader.stats["remaps"]
        pid = zygote.start({"mode": "publish", "dir": str(state), "n": n, "seconds": 1.0,
                            "map_size": 512 * 1024, "keep": 3})
        seen: list[int] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            version, flat = load_published(state)
            assert flat.shape == (n,) and np.all(flat == version), "torn snapshot"
            assert not seen or version >= seen[-1], "version went backwards"
            seen.append(version)
            if not zygote.lines.empty():
                break
        lines, status = zygote.finish(pid)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, lines
        final = int(lines[-1].split()[1])
        assert load_published(state)[0] == final
        assert len(set(seen)) >= 5, f"reader saw too few versions: {sorted(set(seen))[:10]}"
        # the writer grew the map past the reader's: the reader re-read the size and went on
        assert reader.stats["remaps"] > remaps
    finally:
        close_readers()
