"""Progressive validation per tool: how good the gate is for `shell.exec`, `fs.read`, ...

An operator trusts a gate tool by tool. The tool is the context's leading word (an MCP
call string starts with it); each keeps a sliding window of (calibrated p_allow, label).
Cardinality is bounded twice: at most `max_tools` tools are tracked (the least-seen is
dropped when a new one arrives), and only the `top` tools by volume are reported, the
rest pooled as "other" -- so Prometheus sees at most top + 1 label values.
"""

from __future__ import annotations

from collections import Counter, deque

import numpy as np

from .calibration import expected_calibration_error

OTHER = "other"


def tool_of(context: str) -> str:
    """The tool name of a call: its first word (at most 64 characters, printable)."""
    head = context.split(None, 1)[0] if context.strip() else "?"
    return "".join(c if c.isprintable() else "?" for c in head[:64])


class PerTool:
    """Sliding (p_allow, label) windows per tool, top-N by volume reported."""

    def __init__(self, window: int = 500, top: int = 20, max_tools: int = 200) -> None:
        self.window, self.top, self.max_tools = window, top, max_tools
        self.volume: Counter[str] = Counter()
        self._items: dict[str, deque[tuple[float, float]]] = {}

    def observe(self, tool: str, p_allow: float, label: float) -> None:
        if tool not in self._items and len(self._items) >= self.max_tools:
            least = min(self._items, key=lambda t: self.volume[t])
            del self._items[least]
            del self.volume[least]
        self._items.setdefault(tool, deque(maxlen=self.window)).append((p_allow, label))
        self.volume[tool] += 1

    def stats(self) -> dict[str, dict]:
        """{tool: {signals, alignment, ece, confusion}} for the top tools and "other"
        (block is the positive class, as in the alignment window)."""
        top = [t for t, _ in self.volume.most_common(self.top)]
        groups: dict[str, list[tuple[float, float]]] = {t: list(self._items[t]) for t in top}
        rest = [x for t, items in self._items.items() if t not in groups for x in items]
        if rest:
            groups[OTHER] = groups.get(OTHER, []) + rest
        out = {}
        for tool, items in groups.items():
            p = np.array([a for a, _ in items])
            y = np.array([b for _, b in items])
            pred_block, true_block = p < 0.5, y < 0.5
            out[tool] = {
                "signals": len(items),
                "alignment": float(np.mean(pred_block == true_block)) if items else 0.0,
                "ece": expected_calibration_error(p, y),
                "confusion": {"tp": int(np.sum(pred_block & true_block)),
                              "fp": int(np.sum(pred_block & ~true_block)),
                              "tn": int(np.sum(~pred_block & ~true_block)),
                              "fn": int(np.sum(~pred_block & true_block))}}
        return out

    def state(self) -> dict:
        return {"volume": dict(self.volume),
                "items": {t: [list(x) for x in d] for t, d in self._items.items()}}

    def load(self, state: dict | None) -> None:
        if not state:
            return
        self.volume = Counter(state.get("volume", {}))
        self._items = {t: deque((tuple(x) for x in items), maxlen=self.window)
                       for t, items in state.get("items", {}).items()}


def format_table(stats: dict[str, dict]) -> str:
    """The per-tool stats as a text table (for `gated report`)."""
    rows = [f"{'tool':<24} {'signals':>8} {'alignment':>9} {'ECE':>6} {'tp':>5} {'fp':>5} "
            f"{'tn':>6} {'fn':>5}"]
    for tool, s in sorted(stats.items(), key=lambda kv: -kv[1]["signals"]):
        c = s["confusion"]
        rows.append(f"{tool[:24]:<24} {s['signals']:>8} {s['alignment']:>9.3f} "
                    f"{s['ece']:>6.3f} {c['tp']:>5} {c['fp']:>5} {c['tn']:>6} {c['fn']:>5}")
    return "\n".join(rows)
