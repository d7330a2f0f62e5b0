import socket
import sys
from pathlib import Path

import pytest

# tests/ helpers (gradcheck.py, ...) import as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    """A real datagram socket standing in for systemd's notify socket."""
    path = tmp_path / "notify.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield s
    s.close()
