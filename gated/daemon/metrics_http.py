"""The metrics HTTP endpoint: serves a registry on http://HOST:PORT/metrics from a daemon
thread, and stops it.

It lives apart from metrics.py, which defines the series: this part only exposes a
registry, whichever series it holds.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client import start_http_server as _prom_start_http_server

from ..config import parse_hostport

log = logging.getLogger("gated.metrics")


@dataclass
class MetricsServer:
    """A running HTTP endpoint; ``stop()`` shuts it down and frees the port."""

    server: object
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_http_server(addr: str, registry: CollectorRegistry) -> MetricsServer:
    """Serve ``registry`` on http://HOST:PORT/metrics from a daemon thread.

    Raises OSError when the address cannot be bound (say which, so the operator can change
    ``daemon.metrics_addr``).
    """
    host, port = parse_hostport(addr)
    try:
        server, thread = _prom_start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise OSError(e.errno, f"cannot serve metrics on {addr}: {e.strerror}; set "
                               "daemon.metrics_addr (or --metrics-addr) to a free "
                               "HOST:PORT") from e
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return MetricsServer(server=server, thread=thread, host=host, port=bound)
