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


@pytest.fixture
def store(tmp_path):
    """A real `Store` (LMDB) in a temp dir, closed after the test with its reader slots."""
    from gated.store import Store
    from gated.store.env import close_readers

    s = Store(tmp_path / "state")
    yield s
    s.close()
    close_readers()
