"""Child processes for the store's crash and multi-process tests.

Run as ``python tests/helpers_store_child.py zygote``: a small fork server. It imports
gated.store (and NumPy) once, then for every JSON command on stdin forks a fresh child
that opens its OWN Store (the zygote never opens LMDB, so no environment crosses a
fork), prints ``pid N``, and after the child died ``exit N STATUS``. Forking from a warm
process keeps a kill round at a few milliseconds instead of an interpreter start-up,
which is what lets the suite afford dozens of SIGKILL rounds.

Children write complete lines with one ``os.write`` each (atomic on a pipe), so a
SIGKILL never leaves half a line: every line the parent sees was printed after the
commit it reports.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from gated.signals import validate_signal  # noqa: E402
from gated.store import GroupCommitter, Store  # noqa: E402

CKPT_N = 50_000  # floats per checkpoint array: big enough that a kill lands mid-write


def out(text: str) -> None:
    os.write(1, text.encode())


def signal_for(sid: str) -> dict:
    """The content of signal ``sid`` is a function of its id, so the parent can check it."""
    h = sum(sid.encode()) % 97
    sig = {"id": sid, "context": f"tool.call(id={sid!r}) " + "x" * h,
           "decision": "allow" if h % 2 else "block", "reason": f"reason {h}",
           "history": [f"prev {h}"] if h % 3 else []}
    if h % 11 == 0:
        sig["feedback"] = "false_positive"
    return validate_signal(sig)  # as the daemon hands it to the group committer


def child_signals(cmd: dict) -> None:
    """Append signals through group commit from two threads, acking after each commit."""
    store = Store(cmd["dir"], map_size=cmd.get("map_size", 256 * 1024))
    committer = GroupCommitter(store)
    rnd = random.Random(cmd["round"])
    if cmd.get("resend"):
        seq, dup = committer.append([signal_for(cmd["resend"])])[0]
        out(f"dup {cmd['resend']} {seq} {int(dup)}\n")

    def worker(w: int) -> None:
        i = 0
        while True:
            n = rnd.randint(1, cmd.get("batch_max", 8))
            ids = [f"r{cmd['round']}w{w}-{i + k}" for k in range(n)]
            i += n
            results = committer.append([signal_for(s) for s in ids])
            out("".join(f"ack {seq} {sid} {int(dup)}\n"
                        for sid, (seq, dup) in zip(ids, results, strict=True)))

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def child_checkpoints(cmd: dict) -> None:
    """Save checkpoints whose every array encodes the step; publish the step as version.
    With ``piece_bytes`` each array is saved in pieces of that size (several write
    transactions per array, so that kills land between them)."""
    if "piece_bytes" in cmd:
        from gated.store import checkpoint
        checkpoint.PIECE_BYTES = cmd["piece_bytes"]
    store = Store(cmd["dir"], map_size=cmd.get("map_size", 256 * 1024))
    layout = [("w", (CKPT_N,))]
    info = store.checkpoint_info()
    step = info["step"] if info else 0
    while True:
        step += 1
        a = np.full(CKPT_N, step, dtype=np.float32)
        store.save_checkpoint(flat=a, m=a * 2, v=a * 3, step=step, last_trained_seq=step * 10,
                              layout=layout, config_fingerprint="crash-test",
                              ewc={"fisher": a, "anchor": a * 4}, extra={"step": step})
        out(f"ckpt {step}\n")
        store.publish(step, a, step=step, keep=2)
        out(f"pub {step}\n")


def child_publish(cmd: dict) -> None:
    """Publish versions as fast as possible for ``seconds`` (a writer for readers to race)."""
    import time

    store = Store(cmd["dir"], map_size=cmd.get("map_size", 256 * 1024))
    n = cmd.get("n", 100_000)
    version = (store.published_info() or {"version": 0})["version"]
    end = time.monotonic() + cmd.get("seconds", 1.0)
    while time.monotonic() < end:
        version += 1
        store.publish(version, np.full(n, version, dtype=np.float32), step=version,
                      keep=cmd.get("keep", 3))
    out(f"published {version}\n")
    store.close()


MODES = {"signals": child_signals, "checkpoints": child_checkpoints, "publish": child_publish}


def zygote() -> None:
    for line in sys.stdin:
        cmd = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                MODES[cmd["mode"]](cmd)
            except BaseException as e:  # report, never fall back into the zygote loop
                os.write(2, f"child {cmd['mode']} failed: {e!r}\n".encode())
                code = 3
            os._exit(code)
        out(f"pid {pid}\n")
        _, status = os.waitpid(pid, 0)
        out(f"exit {pid} {status}\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["zygote"]:
        zygote()
    else:
        sys.exit("usage: helpers_store_child.py zygote  (then JSON commands on stdin)")
