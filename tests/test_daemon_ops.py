"""The daemon under systemd's protocols and config reloads, as a real process.

systemd as PID 1 cannot exist here, so its side of each protocol is played by the test:
a real AF_UNIX datagram socket as NOTIFY_SOCKET, and a real pre-bound listening socket
handed over as fd 3 with LISTEN_PID/LISTEN_FDS.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from daemon_proc import DaemonProc, start, wait_ready, wait_until

from gated.client import Client
from gated.demo import free_port

CONFIG = """
[train]
lr = 0.003
swap_every_steps = 2
idle_steps_per_second = 2.0
"""


def _notify_socket(tmp_path):
    path = tmp_path / "notify.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(0.2)
    return s, path


def _drain(sock, seen: list[str], until: float) -> None:
    while time.monotonic() < until:
        try:
            seen.append(sock.recv(4096).decode())
        except TimeoutError:
            continue


def test_sd_notify_ready_watchdog_stopping(tmp_path):
    ns, path = _notify_socket(tmp_path)
    cfg = tmp_path / "g.toml"
    cfg.write_text(CONFIG)
    d = start(tmp_path, config=cfg, env={"NOTIFY_SOCKET": str(path),
                                          "WATCHDOG_USEC": "1000000"})
    seen: list[str] = []
    try:
        _drain(ns, seen, time.monotonic() + 3.0)
        joined = "\n".join(seen)
        assert "READY=1" in joined
        assert sum("WATCHDOG=1" in m for m in seen) >= 2, seen
        assert any(m.startswith("STATUS=") or "\nSTATUS=" in m for m in seen)
        ready_at = next(i for i, m in enumerate(seen) if "READY=1" in m)
        first_dog = next(i for i, m in enumerate(seen) if "WATCHDOG=1" in m)
        assert ready_at < first_dog
    finally:
        d.proc.send_signal(signal.SIGTERM)
        _drain(ns, seen, time.monotonic() + 3.0)
        assert d.proc.wait(timeout=60) == 0
        ns.close()
    assert any("STOPPING=1" in m for m in seen), seen


def test_socket_activation_with_listen_fds(tmp_path):
    sock_path = tmp_path / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(16)
    port = free_port()
    # LISTEN_PID must be the daemon's own pid: a tiny wrapper sets it, moves the socket
    # to fd 3 and execs the daemon (exec keeps the pid), as systemd does.
    wrapper = (
        "import os, sys; fd = int(sys.argv[1]); os.dup2(fd, 3); os.set_inheritable(3, True);"
        "os.environ['LISTEN_PID'] = str(os.getpid()); os.environ['LISTEN_FDS'] = '1';"
        "os.execv(sys.executable, [sys.executable, '-m', 'gated.cli'] + sys.argv[2:])"
    )
    log = tmp_path / "act.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", wrapper, str(listener.fileno()), "run", "--state-dir",
             str(tmp_path / "state"), "--socket", str(tmp_path / "unused.sock"),
             "--metrics-addr", f"127.0.0.1:{port}", "--preset", "tiny", "--device", "cpu"],
            stdout=out, stderr=subprocess.STDOUT, pass_fds=(listener.fileno(),),
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    listener.close()  # the daemon holds the only copy now
    d = DaemonProc(proc, tmp_path / "state", sock_path, port, log)
    try:
        wait_ready(d)
        with Client(str(sock_path)) as c:
            assert c.signal({"context": "ls", "decision": "allow"})["seq"] == 1
        assert not (tmp_path / "unused.sock").exists()
        assert "LISTEN_FDS" in d.log()
    finally:
        assert d.stop() == 0


def test_config_reload_applies_lr_and_refuses_invalid_file(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text(CONFIG)
    d = start(tmp_path, config=cfg)
    try:
        with d.client() as c:
            assert c.status()["lr"] == 0.003
            c.signals([{"context": f"bash ls {i}", "decision": "allow"} for i in range(40)])
            cfg.write_text(CONFIG.replace("lr = 0.003", "lr = 0.0005"))
            wait_until(lambda: c.status()["lr"] == 0.0005, what="lr reloaded from the file")
            wait_until(lambda: 'gated_learning_rate 0.0005' in d.scrape(), timeout=60,
                       what="the next step to report the new learning rate")
            # An invalid file is refused; the last good config stays.
            cfg.write_text(CONFIG.replace("lr = 0.003", "lr = -1"))
            wait_until(lambda: 'gated_config_reloads_total{result="failed"} 1.0' in d.scrape(),
                       what="the failed reload to be counted")
            assert c.status()["lr"] == 0.0005
            # SIGHUP reloads too: fix the file and send it.
            cfg.write_text(CONFIG.replace("lr = 0.003", "lr = 0.002"))
            d.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: c.status()["lr"] == 0.002, what="lr reloaded on SIGHUP")
        assert "keeping the last good config" in d.log()
    finally:
        assert d.stop() == 0
