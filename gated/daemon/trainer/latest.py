"""The replay filter: the newest label seen for each call, so replay never teaches a
label that a newer signal for the same call contradicts."""

from __future__ import annotations

from collections import OrderedDict

from ...signals import context_fingerprint


class LatestLabels:
    """Newest label per context fingerprint, from fresh signals (bounded LRU, in memory).

    When the gate's policy changes, the reservoir still holds the old label of every call
    it has seen; replaying those against the fresh ones pins the model halfway between the
    two policies. The newest label of an identical call is the policy now.
    """

    def __init__(self, cap: int = 200_000) -> None:
        self.cap = cap
        self._latest: OrderedDict[bytes, float] = OrderedDict()

    def note(self, fresh: list[dict]) -> None:
        """Remember the labels of fresh examples (newest wins)."""
        for ex in fresh:
            fp = context_fingerprint(ex["context"])
            self._latest[fp] = ex["label"]
            self._latest.move_to_end(fp)
        while len(self._latest) > self.cap:
            self._latest.popitem(last=False)

    def current(self, replay: list[dict]) -> list[dict]:
        """The replayed examples no newer signal contradicts. Locked examples (a person's
        false-positive/negative correction) are always kept."""
        out = []
        for ex in replay:
            newest = self._latest.get(context_fingerprint(ex["context"]))
            if ex.get("locked") or newest is None or newest == ex["label"]:
                out.append(ex)
        return out
