"""Addresses in the config: ``HOST:PORT`` of the metrics endpoint, Unix socket paths.

Pure string checks (no sockets are opened); the daemon's metrics server parses its
address with the same :func:`parse_hostport` the config validates it with.
"""

from __future__ import annotations

#: Bytes of a Unix socket path (``sun_path`` is 108 bytes with the NUL).
SUN_PATH_MAX = 107


def parse_hostport(addr: str) -> tuple[str, int]:
    """"127.0.0.1:9464" -> ("127.0.0.1", 9464); "[::1]:9464" -> ("::1", 9464).

    Port 0 asks the kernel for a free port (tests). Raises ValueError with what is wrong.
    """
    if not isinstance(addr, str) or ":" not in addr:
        raise ValueError(f"{addr!r} is not HOST:PORT (e.g. 127.0.0.1:9464 or [::1]:9464)")
    host, _, port_s = addr.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{addr!r}: write an IPv6 host in brackets, e.g. [::1]:9464")
    if not host:
        raise ValueError(f"{addr!r} has no host (use 0.0.0.0 to listen on every IPv4 "
                         "address)")
    if not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise ValueError(f"{addr!r}: port must be a number in 0..65535")
    return host, int(port_s)
