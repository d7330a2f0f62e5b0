"""A full disk (or a map at its cap) is a clear error; nothing acknowledged is lost."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gated.store import GroupCommitter, Store, StoreFullError

KiB = 1024


def sig(i: int, size: int = 900) -> dict:
    return {"id": f"s{i}", "context": f"db.query(n={i}) " + "q" * size, "decision": "allow"}


def fill_until_full(s: Store, start: int = 0, batch: int = 10) -> tuple[dict[int, str], Exception]:
    """Append until a commit fails; returns what was acknowledged, and the error."""
    acked: dict[int, str] = {}
    i = start
    for _ in range(100_000):
        try:
            res = s.append_signals([sig(i + k) for k in range(batch)])
        except StoreFullError as e:
            return acked, e
        for k, (seq, dup) in enumerate(res):
            assert not dup
            acked[seq] = f"s{i + k}"
        i += batch
    raise AssertionError("never filled up")


def assert_all_present(s: Store, acked: dict[int, str]) -> None:
    log = dict(s.read_signals(0, 10**9))
    for seq, sid in acked.items():
        assert log[seq]["id"] == sid, f"acknowledged signal {seq} lost"
    assert sorted(log) == list(range(1, len(log) + 1))


def test_capped_map_gives_clear_error_and_keeps_everything(tmp_path):
    path = tmp_path / "state"
    with Store(path, map_size=64 * KiB, max_map_size=256 * KiB) as s:
        acked, err = fill_until_full(s)
        msg = str(err)
        assert "max_map_size" in msg and "acknowledged" in msg and "kept" in msg
        assert len(acked) > 50
        assert_all_present(s, acked)
        # the group-commit front end reports the same error to every waiting caller
        with GroupCommitter(s) as gc:
            futures = [gc.submit([sig(10**6 + k)]) for k in range(5)]
            futures.append(gc.submit([sig(2 * 10**6 + k) for k in range(200)]))
            errors = [f.exception(timeout=10) for f in futures]
        assert any(isinstance(e, StoreFullError) for e in errors)
        # a tiny write may still fit; everything that did commit is readable
        for f, e in zip(futures, errors, strict=True):
            if e is None:
                acked.update({seq: "?" for seq, _ in f.result()})
        count = s.count_signals()
    # raise the cap: the same state opens and takes writes again
    with Store(path, max_map_size=4 << 20) as s:
        assert s.count_signals() == count
        assert_all_present(s, {k: v for k, v in acked.items() if v != "?"})
        assert s.append_signals([sig(-1)]) == [(count + 1, False)]


def _mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a small tmpfs; returns why not if this machine does not allow it."""
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"mount -t tmpfs not permitted here: {r.stderr.strip() or r.returncode}"
    return None


def test_full_disk_then_space_freed(tmp_path):
    mnt = tmp_path / "fs"
    why = _mount_tmpfs(mnt, "2m")
    if why:
        pytest.skip(why + "; the capped-map test covers the store-full path")
    try:
        ballast = mnt / "ballast"
        ballast.write_bytes(b"\0" * (512 * KiB))
        path = mnt / "state"
        with Store(path, map_size=64 * KiB) as s:  # the map may grow; the disk will not
            acked, err = fill_until_full(s)
            msg = str(err)
            assert isinstance(err, StoreFullError)
            assert "disk" in msg and "full" in msg and "acknowledged" in msg
            assert len(acked) > 50
            assert_all_present(s, acked)
            # the trainer's writes fail the same clear way
            with pytest.raises(StoreFullError):
                big = np.ones(200_000, np.float32)
                s.save_checkpoint(flat=big, m=big, v=big, step=1, last_trained_seq=0,
                                  layout=[("w", (200_000,))], config_fingerprint="fp")
            ballast.unlink()  # the operator frees space
            (seq, dup), = s.append_signals([sig(-1)])
            assert s.stats["reopens"] >= 1  # the environment was reopened after the failure
            assert not dup and seq == max(acked) + 1
            acked[seq] = "s-1"
        # a restart opens the state with everything acknowledged
        with Store(path) as s:
            assert_all_present(s, acked)
            assert s.count_signals() == len(acked)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
