"""A real nats-server (JetStream, temp dir) and real `gated run --role ...` processes for
the cluster tests (tests/test_cluster.py) and bench/bench_cluster.py."""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemon_proc import QUIET, DaemonProc, start, wait_until

from gated.cluster.nats import find_nats_server
from gated.demo import free_port

#: Trains, publishes and redelivers quickly; no idle steps, so versions change only
#: when signals arrive (tests can hold the version still).
CLUSTER_FAST = QUIET


@dataclass
class NatsServer:
    port: int
    store: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: int = field(default=0)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        cmd = [find_nats_server(), "-a", "127.0.0.1", "-p", str(self.port), "-js",
               "-sd", str(self.store)]
        out = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"nats-server exited {self.proc.returncode}:\n"
                                     f"{self.log_path.read_text(errors='replace')}")
            if "Server is ready" in self.log_path.read_text(errors="replace").split(
                    "Starting nats-server")[-1]:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return
                except OSError:
                    pass
            time.sleep(0.05)
        raise AssertionError("nats-server not ready")

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()


def nats_server(tmp: Path) -> NatsServer:
    s = NatsServer(free_port(), tmp / "jetstream", tmp / "nats-server.log")
    s.start()
    return s


def cluster_config(tmp: Path, nats: NatsServer, name: str, *, extra: str = "",
                   train: str = CLUSTER_FAST) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f"""{train}
[cluster]
servers = "{nats.url}"
name = "{name}"
publish_timeout_s = 1.0
ack_wait_s = 3.0
poll_s = 0.5
{extra}
""")
    return path


def start_role(tmp: Path, nats: NatsServer, role: str, name: str, *, extra: str = "",
               train: str = CLUSTER_FAST, args: list[str] | None = None,
               wait: bool = True) -> DaemonProc:
    home = tmp / name
    home.mkdir(exist_ok=True)
    cfg = cluster_config(home, nats, name, extra=extra, train=train)
    # short socket paths: AF_UNIX is limited to 108 bytes
    return start(home, config=cfg, extra=["--role", role, *(args or [])], wait=wait,
                 sock=home / "s.sock")


def connected(d: DaemonProc) -> bool:
    try:
        with d.client(timeout=5) as c:
            return bool(c.status().get("cluster", {}).get("nats_connected"))
    except OSError:
        return False


def version(d: DaemonProc) -> int:
    with d.client(timeout=10) as c:
        return int(c.ping()["version"])


def wait_connected(*ds: DaemonProc, timeout: float = 60.0) -> None:
    for d in ds:
        wait_until(lambda d=d: connected(d), timeout, f"{d.sock} connected to NATS")
