"""Progressive validation: every signal is scored by the serving model before training.

Two windows: `AlignmentWindow` compares each prediction with the label the signal carried
when it arrived (the gate's decision, or a person's feedback), as DESIGN.md section 2
defines alignment. `CorrectedAlignment` compares the same predictions with the label as
corrected LATER: a gate is wrong a few percent of the time and a person's
false_positive/false_negative report arrives signals afterwards; scoring against the
gate alone would reward a model for copying the gate's mistakes.
"""

from __future__ import annotations

from collections import deque


class AlignmentWindow:
    """Alignment over the last `size` scored signals (positive = block)."""

    def __init__(self, size: int = 1000) -> None:
        self.size = size
        self.items: deque[tuple[bool, bool]] = deque(maxlen=size)  # (pred_block, true_block)
        self.total_scored = 0

    def add(self, p_allow: float, label: float) -> bool:
        pred_block, true_block = p_allow < 0.5, label < 0.5
        self.items.append((pred_block, true_block))
        self.total_scored += 1
        return pred_block == true_block

    @property
    def alignment(self) -> float:
        if not self.items:
            return 0.0
        return sum(p == t for p, t in self.items) / len(self.items)

    @property
    def full(self) -> bool:
        return len(self.items) == self.size

    def converged(self, threshold: float) -> bool:
        return self.full and self.alignment >= threshold

    def dump(self) -> list[int]:
        """The window as small ints (2*pred_block + true_block), oldest first: for checkpoints."""
        return [2 * int(p) + int(t) for p, t in self.items]

    def load(self, codes: list[int]) -> None:
        """Restore a dumped window (a restart keeps reporting alignment over the same 1000)."""
        self.items.extend((bool(c & 2), bool(c & 1)) for c in codes[-self.size:])

    def confusion(self) -> dict[str, int]:
        c = {"tp": 0, "fp": 0, "tn": 0, "fn": 0}
        for pred, true in self.items:
            c[("t" if pred == true else "f") + ("p" if pred else "n")] += 1
        return c


class CorrectedAlignment:
    """Alignment of the last `size` predictions against labels corrected afterwards.

    `add` records a scored ordinary signal under its (context, history) fingerprint;
    `correct` relabels every recorded prediction of that fingerprint still in the window
    (a correction signal is itself not added: it is the same call scored again).
    """

    def __init__(self, size: int = 1000) -> None:
        self.size = size
        self._items: deque[list] = deque()  # [fingerprint, pred_block, label_block]
        self._corrections = 0

    def add(self, fingerprint: bytes, p_allow: float, label: float) -> None:
        self._items.append([fingerprint, p_allow < 0.5, label < 0.5])
        while len(self._items) > self.size:
            self._items.popleft()

    def correct(self, fingerprint: bytes, label: float) -> int:
        """Relabel the window's predictions of `fingerprint`; returns how many changed."""
        changed = 0
        for item in self._items:
            if item[0] == fingerprint and item[2] != (label < 0.5):
                item[2] = label < 0.5
                changed += 1
        self._corrections += changed
        return changed

    @property
    def alignment(self) -> float:
        if not self._items:
            return 0.0
        return sum(p == t for _, p, t in self._items) / len(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def dump(self) -> list:
        return [[fp, int(p), int(t)] for fp, p, t in self._items]

    def load(self, rows: list) -> None:
        for fp, p, t in rows[-self.size:]:
            self._items.append([bytes(fp), bool(p), bool(t)])
