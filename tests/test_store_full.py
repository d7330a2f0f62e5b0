"""A full disk (or a map at its cap) is a clear error; nothing acknowledged is lost."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from daemon_proc import metric_samples, metric_value, start, wait_until

from gated.signals import validate_signal
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
            futures = [gc.submit([validate_signal(sig(10**6 + k))]) for k in range(5)]
            futures.append(gc.submit([validate_signal(sig(2 * 10**6 + k))
                                      for k in range(200)]))
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


# --- the daemon on a full disk (issue 13, defect 1) ----------------------------------------

MiB = 1 << 20


def _mount_ext4(where: Path, size: str) -> str | None:
    """Mount a small ext4 image through a loop device, with no blocks reserved for root
    (so that a full disk is full for root too, as it is for the `gated` user)."""
    if os.geteuid() != 0:
        return "mounting an ext4 image needs root"
    image = where.parent / "ext4.img"
    where.mkdir()
    for cmd in (["truncate", "-s", size, str(image)],
                ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
                ["mount", "-o", "loop", str(image), str(where)]):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:
            return f"{cmd[0]} is not installed"
        if r.returncode != 0:
            return f"{' '.join(cmd[:2])} failed here: {r.stderr.strip() or r.returncode}"
    return None


def _tmpfs(tmp_path: Path, size: str, fs: str = "tmpfs") -> Path:
    mnt = tmp_path / "fs"
    why = (_mount_tmpfs if fs == "tmpfs" else _mount_ext4)(mnt, size)
    if why:
        pytest.skip(why + "; test_start_refused_below_disk_free_min checks the free-space "
                          "refusal on this filesystem")
    return mnt


def _fill(mnt: Path, leave: int = 0) -> Path:
    """Write a ballast file until the filesystem has at most ``leave`` bytes free."""
    ballast = mnt / "ballast"
    with open(ballast, "ab") as f:
        for chunk in (1 << 20, 1 << 16, 1 << 12):
            while True:
                st = os.statvfs(mnt)
                if st.f_bavail * st.f_frsize - chunk < leave:
                    break
                try:
                    f.write(b"\xff" * chunk)
                    f.flush()
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break
    return ballast


def _run_to_exit(tmp_path: Path, state: Path, config: str = "",
                 timeout: float = 60.0) -> subprocess.CompletedProcess:
    cfg = tmp_path / "gated.toml"
    cfg.write_text(config)
    cmd = [sys.executable, "-m", "gated.cli", "run", "--config", str(cfg), "--state-dir",
           str(state), "--socket", str(tmp_path / "gated.sock"), "--metrics-addr", "",
           "--preset", "tiny", "--device", "cpu"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("fs", ["tmpfs", "ext4"])
def test_daemon_start_on_a_full_disk_exits_1_and_leaves_nothing(tmp_path, fs):
    """A full filesystem and an existing (empty) state dir, as systemd's StateDirectory=
    makes it: `gated run` used to die of SIGBUS in lmdb.open (exit -7, "Fatal Python
    error: Bus error", a stray lock.mdb), on tmpfs and on ext4. Now it exits 1 with the
    path and the free space, by the free-space check (the default
    daemon.disk_free_min_mib) and, with that check off, by the lock file's reservation
    before LMDB maps it."""
    mnt = _tmpfs(tmp_path, "4m" if fs == "tmpfs" else "16M", fs)
    try:
        state = mnt / "state"
        state.mkdir(mode=0o750)
        _fill(mnt)
        for config, words in (("", "daemon.disk_free_min_mib"),
                              ("[daemon]\ndisk_free_min_mib = 0\n", "is full")):
            r = _run_to_exit(tmp_path, state, config)
            out = r.stdout + r.stderr
            assert r.returncode == 1, (r.returncode, out)
            assert "Bus error" not in out and "Traceback" not in out, out
            assert "gated could not start" in out and str(state) in out, out
            assert " free" in out and words in out, out
            assert "Free space on that filesystem" in out, out
            left = sorted(p.name for p in state.iterdir() if p.name != "lost+found")
            assert left == [], f"left files behind: {left}"
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_existing_state_on_a_full_disk_is_refused_then_opens_intact(tmp_path):
    mnt = _tmpfs(tmp_path, "24m")
    try:
        cfg = tmp_path / "d.toml"
        cfg.write_text("[daemon]\ndisk_free_min_mib = 2\n")
        d = start(tmp_path, config=cfg, state_dir=mnt / "state")
        sigs = [{"id": f"full-{i}", "context": f"fs.read /etc/{i}", "decision": "allow"}
                for i in range(50)]
        with d.client() as c:
            acked = c.signals(sigs)
        assert d.stop() == 0, d.log()
        ballast = _fill(mnt)
        r = _run_to_exit(tmp_path, mnt / "state", cfg.read_text())
        out = r.stdout + r.stderr
        assert r.returncode == 1 and "Bus error" not in out, out
        assert str(mnt / "state") in out and "daemon.disk_free_min_mib" in out, out
        ballast.unlink()  # the operator frees space: everything is there
        d = start(tmp_path, config=cfg, state_dir=mnt / "state")
        try:
            with d.client() as c:
                again = c.signals(sigs)
                assert [(r["seq"], r["duplicate"]) for r in again] == \
                    [(r["seq"], True) for r in acked]
                assert c.status()["last_seq"] == 50
        finally:
            assert d.stop() == 0, d.log()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_low_disk_space_is_watched_while_running(tmp_path):
    mnt = _tmpfs(tmp_path, "48m")
    try:
        cfg = tmp_path / "d.toml"
        cfg.write_text("[daemon]\ndisk_free_min_mib = 2\ndisk_free_warn_mib = 16\n")
        d = start(tmp_path, config=cfg, state_dir=mnt / "state")
        try:
            def gauges():
                got = metric_samples(d.scrape())
                return (metric_value(got, "gated_disk_free_bytes"),
                        metric_value(got, "gated_disk_low"))

            free, low = gauges()
            assert low == 0 and free > 16 * MiB
            assert abs(free - os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize) < 8 * MiB
            ballast = _fill(mnt, leave=8 * MiB)
            free, low = wait_until(lambda: (g := gauges())[1] == 1 and g, timeout=20,
                                   what="gated_disk_low to become 1")
            assert free < 16 * MiB
            wait_until(lambda: "below daemon.disk_free_warn_mib" in d.log(), timeout=10,
                       what="the warning")
            assert str(mnt / "state") in d.log()
            with d.client() as c:  # still serving while low
                assert c.signal({"context": "ls", "decision": "allow"})["seq"] == 1
            ballast.unlink()
            wait_until(lambda: gauges()[1] == 0, timeout=20, what="gated_disk_low back to 0")
            time.sleep(0.1)
            assert "free again" in d.log()
        finally:
            assert d.stop() == 0, d.log()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_start_refused_below_disk_free_min(tmp_path):
    """Runs without root: the real statvfs of this test's filesystem against a threshold
    above it. Nothing is created."""
    state = tmp_path / "state"
    r = _run_to_exit(tmp_path, state, "[daemon]\ndisk_free_min_mib = 1073741824\n")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert f"not opening the gated state in {state}" in out, out
    assert "free, less than the 1024.0 TiB required (daemon.disk_free_min_mib)" in out, out
    assert not state.exists()
