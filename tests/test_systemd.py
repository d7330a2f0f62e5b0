"""systemd integration: sd_notify, watchdog, socket activation, and the unit files.

systemd cannot be PID 1 in this test environment, so nothing here is "systemd itself":
the notify tests bind a REAL AF_UNIX datagram socket and point NOTIFY_SOCKET at it, which
is exactly what systemd does for a Type=notify service (it reads the same datagrams);
socket activation is tested in a REAL child process that inherits a pre-bound listening
socket on fd 3 with LISTEN_PID/LISTEN_FDS set, as systemd would start it. The unit files
are checked with the real `systemd-analyze` (skipped only where it is not installed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gated.daemon import systemd

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "systemd"
ANALYZE = shutil.which("systemd-analyze")
SYSUSERS = shutil.which("systemd-sysusers")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def recv(s: socket.socket) -> str:
    return s.recv(65536).decode()


# --- sd_notify --------------------------------------------------------------------------

def test_notify_messages(notify_socket):
    assert systemd.ready()
    assert recv(notify_socket) == "READY=1"
    assert systemd.ready("serving, step 0")
    assert recv(notify_socket) == "READY=1\nSTATUS=serving, step 0"
    assert systemd.status("step 12\nversion 3")  # one line: a newline would start a new key
    assert recv(notify_socket) == "STATUS=step 12 version 3"
    assert systemd.watchdog_ping()
    assert recv(notify_socket) == "WATCHDOG=1"
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert systemd.reloading()
    msg = recv(notify_socket)
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    m = re.fullmatch(r"RELOADING=1\nMONOTONIC_USEC=(\d+)", msg)
    assert m and before <= int(m.group(1)) <= after
    assert systemd.stopping("draining")
    assert recv(notify_socket) == "STOPPING=1\nSTATUS=draining"


def test_notify_abstract_namespace(monkeypatch):
    name = f"gated-test-{os.getpid()}-{time.monotonic_ns()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    s.settimeout(5)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify("READY=1")
        assert recv(s) == "READY=1"
    finally:
        s.close()


def test_notify_is_a_noop_outside_systemd(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert systemd.watchdog_ping() is False
    assert "sd_notify 'WATCHDOG=1'" in caplog.text
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert systemd.ready() is False


def test_notify_from_a_child_process(notify_socket):
    """The daemon is its own process: READY, WATCHDOG and STOPPING arrive from it."""
    code = ("from gated.daemon import systemd as s; s.ready('up'); s.watchdog_ping(); "
            "s.stopping('bye')")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    assert [recv(notify_socket) for _ in range(3)] == [
        "READY=1\nSTATUS=up", "WATCHDOG=1", "STOPPING=1\nSTATUS=bye"]


def test_watchdog_interval():
    pid = str(os.getpid())
    assert systemd.watchdog_interval({}) is None
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": pid}) == 15.0
    assert systemd.watchdog_timeout({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": pid}) == 30.0
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "0"}) is None


# --- socket activation --------------------------------------------------------------------

CHILD = r"""
import json, os, socket, sys
from gated.daemon import systemd
named = systemd.listen_fds_with_names()
left = {k: os.environ.get(k) for k in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")}
info = [{"name": n, "fd": s.fileno(), "family": int(s.family), "type": int(s.type),
         "inheritable": os.get_inheritable(s.fileno())} for n, s in named]
print(json.dumps({"socks": info, "env_left": left}), flush=True)
if named:
    conn, _ = named[0][1].accept()
    conn.sendall(b"hello " + conn.recv(100))
    conn.close()
"""

# What systemd does between fork and exec: the socket at fd 3, LISTEN_PID = the pid that
# will run the service (exec keeps the pid), LISTEN_FDS, LISTEN_FDNAMES.
WRAPPER = r"""
import os, sys
fd = int(os.environ.pop("PASS_FD"))
if fd != 3:
    os.dup2(fd, 3)
os.environ["LISTEN_PID"] = os.environ.pop("FAKE_LISTEN_PID", str(os.getpid()))
os.environ["LISTEN_FDS"] = "1"
os.environ["LISTEN_FDNAMES"] = "gated.socket"
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""


def spawn_activated(listener: socket.socket, **env_extra: str) -> subprocess.Popen:
    env = {**os.environ, "PASS_FD": str(listener.fileno()), **env_extra}
    return subprocess.Popen([sys.executable, "-c", WRAPPER, CHILD], cwd=ROOT, env=env,
                            pass_fds=(listener.fileno(),), stdout=subprocess.PIPE, text=True)


def test_listen_fds_in_an_activated_child(tmp_path):
    path = tmp_path / "gated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    proc = spawn_activated(listener)
    listener.close()  # only the child holds it now, as with systemd's copy passed on
    try:
        report = json.loads(proc.stdout.readline())
        assert report["socks"] == [{"name": "gated.socket", "fd": 3,
                                    "family": int(socket.AF_UNIX),
                                    "type": int(socket.SOCK_STREAM), "inheritable": False}]
        assert report["env_left"] == {"LISTEN_PID": None, "LISTEN_FDS": None,
                                      "LISTEN_FDNAMES": None}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(10)
            c.connect(str(path))
            c.sendall(b"gateway")
            assert c.recv(100) == b"hello gateway"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_listen_fds_meant_for_another_process_are_ignored(tmp_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s"))
    listener.listen(1)
    proc = spawn_activated(listener, FAKE_LISTEN_PID="1")
    listener.close()
    try:
        report = json.loads(proc.stdout.readline())
        assert report["socks"] == []
        assert report["env_left"]["LISTEN_FDS"] is None  # still unset for children
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_listen_fds_not_activated():
    env = {"PATH": "/bin"}
    assert systemd.listen_fds(env=env) == []
    env = {"LISTEN_PID": "abc", "LISTEN_FDS": "1"}
    assert systemd.listen_fds(env=env) == [] and env == {}


# --- unit files ---------------------------------------------------------------------------

def unit_text(name: str) -> str:
    return (UNITS / name).read_text()


def directives(name: str) -> list[tuple[str, str]]:
    out = []
    for line in unit_text(name).splitlines():
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            k, _, v = line.partition("=")
            out.append((k.strip(), v.strip()))
    return out


def test_service_unit_contract():
    d = directives("gated.service")
    get = dict(d)
    assert get["Type"] == "notify" and get["NotifyAccess"] == "main"
    assert get["ExecStart"].startswith("/usr/bin/gated run")
    assert get["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert get["WatchdogSec"] == "30" and get["Restart"] == "on-failure"
    assert get["StateDirectory"] == "gated"
    assert get["User"] == "gated" and get["Group"] == "gated"
    assert get["DevicePolicy"] == "closed"
    allowed = [v for k, v in d if k == "DeviceAllow"]
    for dev in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        assert f"{dev} rw" in allowed
    assert "PrivateDevices" not in get  # it would hide the GPU
    assert get["RestrictAddressFamilies"] == "AF_UNIX AF_INET AF_INET6"
    assert get["NoNewPrivileges"] == "yes" and get["ProtectSystem"] == "strict"


def test_socket_unit_contract():
    get = dict(directives("gated.socket"))
    assert get["ListenStream"] == "/run/gated.sock"
    assert get["SocketMode"] == "0660" and get["SocketGroup"] == "gated"
    runtime = dict(directives("gated.service")).get("RuntimeDirectory")
    if runtime:  # the socket must not live where the service's stop would delete it
        assert not get["ListenStream"].startswith(f"/run/{runtime}/")


def analyze(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C.UTF-8"}
    return subprocess.run([ANALYZE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def installed_copy(tmp_path: Path) -> Path:
    """The units as they would be installed on a host where gated is installed.

    `systemd-analyze verify` checks that ExecStart's binary exists; /usr/bin/gated does not
    on this machine (gated lives in the checkout's venv). So the copy runs the SAME program
    by an existing path (this interpreter, `-m gated.cli`, the module the console script
    calls); that ExecStart line is the only difference, which the test asserts.
    """
    d = tmp_path / "units"
    d.mkdir()
    shutil.copy(UNITS / "gated.socket", d / "gated.socket")
    original = unit_text("gated.service")
    exe = f"{sys.executable} -m gated.cli run"
    copy = original.replace("ExecStart=/usr/bin/gated run", f"ExecStart={exe}")
    diff = [(a, b) for a, b in
            zip(original.splitlines(), copy.splitlines(), strict=True) if a != b]
    assert len(diff) == 1 and diff[0][0].startswith("ExecStart=/usr/bin/gated run")
    (d / "gated.service").write_text(copy)
    return d


@needs_analyze
def test_systemd_analyze_verify_prints_no_warnings(tmp_path):
    d = installed_copy(tmp_path)
    res = analyze("verify", "gated.service", "gated.socket", cwd=d)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == "", res.stdout + res.stderr


@needs_analyze
def test_systemd_analyze_verify_is_not_vacuous(tmp_path):
    """The check above would see a problem: an unknown directive is reported."""
    d = installed_copy(tmp_path)
    svc = d / "gated.service"
    svc.write_text(svc.read_text().replace("[Install]", "Frobnicate=yes\n\n[Install]"))
    res = analyze("verify", "gated.service", "gated.socket", cwd=d)
    assert "Unknown key" in res.stdout + res.stderr


@needs_analyze
def test_systemd_analyze_security_at_most_4(tmp_path):
    res = analyze("security", "--offline=yes", str(UNITS / "gated.service"), cwd=tmp_path)
    out = res.stdout + res.stderr
    if "--offline" in out and ("unrecognized" in out or "Unknown option" in out):
        pytest.skip("this systemd-analyze has no --offline (needs systemd >= 250)")
    m = re.search(r"Overall exposure level for gated\.service:\s*([0-9.]+)", out)
    assert m, out
    assert float(m.group(1)) <= 4.0, out


MDWE_CHILD = r"""
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:  # PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN (Linux >= 6.3)
    print("unsupported", os.strerror(ctypes.get_errno()))
    sys.exit(0)
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit("W+X memory was allowed: the check below would prove nothing")
except OSError:
    pass
ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 1)()  # libffi closures (watchdog uses ctypes)
import numpy as np
from gated.engine import AdamW, Model, ModelConfig, build_batch
from gated.daemon.reload import ConfigWatcher
from gated.daemon.metrics import Metrics
cfg = ModelConfig.tiny()
model = Model.init(cfg, seed=0, backend="numpy", dtype="float32")
batch = build_batch([{"context": "shell.exec ls", "history": [], "reason": "ok",
                      "label": 1, "weight": 1.0}], cfg)
loss, _ = model.loss_and_grads(batch)
AdamW.for_model(model).step(model.flat, model.grad_flat)
srv = Metrics().serve("127.0.0.1:0"); srv.stop()
w = ConfigWatcher(sys.argv[1], lambda: None).start(); w.stop()
print("ok", np.isfinite(loss))
"""


def test_the_cpu_stack_runs_without_writable_executable_memory(tmp_path):
    """gated.service sets MemoryDenyWriteExecute=yes. Without systemd, the kernel's own
    W^X switch (prctl PR_SET_MDWE, the same rule) shows the daemon's CPU stack (NumPy,
    the engine, watchdog's ctypes, the metrics server) works under it. The GPU side
    (CuPy/CUDA) cannot be checked here: see docs/operations.md, GPU notes."""
    cfg = tmp_path / "gated.toml"
    cfg.write_text("")
    res = subprocess.run([sys.executable, "-c", MDWE_CHILD, str(cfg)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    if res.stdout.startswith("unsupported"):
        pytest.skip(f"kernel without PR_SET_MDWE (needs Linux >= 6.3): {res.stdout}")
    assert res.stdout.strip() == "ok True", res.stdout + res.stderr


@pytest.mark.skipif(SYSUSERS is None, reason="systemd-sysusers is not installed")
def test_sysusers_file(tmp_path):
    (tmp_path / "etc").mkdir()
    res = subprocess.run([SYSUSERS, "--dry-run", f"--root={tmp_path}",
                          str(UNITS / "gated-sysusers.conf")], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "SYSTEMD_COLORS": "0"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "Creating group 'gated'" in out and "Creating user 'gated'" in out
    assert not re.search(r"unknown|invalid|fail|ignor", out, re.I), out
