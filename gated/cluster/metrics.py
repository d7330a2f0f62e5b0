"""The gated_cluster_* Prometheus series, on the daemon's registry (every role).

docs/cluster.md documents each one (tests/test_cluster.py checks it)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Every cluster series and its kind.
CLUSTER_SERIES: dict[str, str] = {
    "gated_cluster_role_info": "gauge",
    "gated_cluster_nats_connected": "gauge",
    "gated_cluster_signals_published_total": "counter",
    "gated_cluster_publish_duration_seconds": "histogram",
    "gated_cluster_signals_consumed_total": "counter",
    "gated_cluster_snapshots_published_total": "counter",
    "gated_cluster_snapshots_total": "counter",
    "gated_cluster_trainer_version": "gauge",
    "gated_cluster_version_lag": "gauge",
    "gated_cluster_propagation_seconds": "histogram",
}

_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
            10.0)


class ClusterMetrics:
    def __init__(self, registry: CollectorRegistry, role: str) -> None:
        r = registry
        self.role = Gauge("gated_cluster_role_info", "1, labelled with this node's cluster "
                          "role (edge or trainer)", ["role"], registry=r)
        self.role.labels(role=role).set(1)
        self.connected = Gauge("gated_cluster_nats_connected", "1 while connected to NATS, "
                               "else 0", registry=r)
        self.published = Counter("gated_cluster_signals_published", "Edge: signals sent to "
                                 "JetStream, by result (acked: stored by JetStream, "
                                 "duplicate: an id it already had, refused: answered "
                                 "overloaded)", ["result"], registry=r)
        for res in ("acked", "duplicate", "refused"):
            self.published.labels(result=res)
        self.publish_seconds = Histogram("gated_cluster_publish_duration_seconds", "Edge: "
                                         "from a signal request to JetStream's last ack",
                                         buckets=_SECONDS, registry=r)
        self.consumed = Counter("gated_cluster_signals_consumed", "Trainer: JetStream "
                                "messages acked after their LMDB commit, by result "
                                "(stored, duplicate: the id was already in the log, "
                                "invalid: terminated)", ["result"], registry=r)
        for res in ("stored", "duplicate", "invalid"):
            self.consumed.labels(result=res)
        self.snapshots_published = Counter("gated_cluster_snapshots_published", "Trainer: "
                                           "versions put in the Object Store and named in "
                                           "the KV key", registry=r)
        self.snapshots = Counter("gated_cluster_snapshots", "Edge: snapshots fetched, by "
                                 "result (installed, refused: corrupt, partial or of "
                                 "another layout; the old one keeps serving)", ["result"],
                                 registry=r)
        for res in ("installed", "refused"):
            self.snapshots.labels(result=res)
        self.trainer_version = Gauge("gated_cluster_trainer_version", "The version the KV "
                                     "key names (the trainer's newest)", registry=r)
        self.version_lag = Gauge("gated_cluster_version_lag", "Edge: the trainer's version "
                                 "minus the version this edge serves", registry=r)
        self.propagation = Histogram("gated_cluster_propagation_seconds", "Edge: from the "
                                     "trainer's publish to this edge serving the version",
                                     buckets=_SECONDS, registry=r)
