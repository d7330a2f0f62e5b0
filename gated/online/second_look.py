"""A second look: every example learned once more, a fixed number of signals later, under
the newest label its call has had by then.

Why (docs/learning.md, "A second look"): a single online pass learns each signal with
the gate's label of the moment, and about 6% of those are wrong; most of the mistakes
are corrected 5-50 signals later, by when the wrong label has been learned and what came
after it has been learned on top of it. Learning every example a second time, `delay`
signals later, gives each call a look with the label people have settled on (a
correction relabels the pending look of its call), and gives the few examples of a rare
block category twice the say in the shared features a held-out value is judged by. The
delay is what makes it a second look rather than a replay: it comes after the
corrections, at a fixed schedule (each example exactly twice), never from a reservoir of
what the old policy said.

The learner is the caller's: this object only keeps the schedule (what is due, with
which label). Its queue is in memory and is not checkpointed: a restart forgets at most
`delay` pending second looks, whose first looks are in the checkpoint.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

Payload = TypeVar("Payload")


class DueLook(NamedTuple, Generic[Payload]):
    """A second look now due: what was learned, the newest label of its call, and whether
    that label is a correction's (a person's) rather than the gate's own."""
    payload: Payload
    label: float
    corrected: bool


class SecondLook(Generic[Payload]):
    """The examples learned in the last `delay` signals, each due for a second look when
    `delay` newer ones have been learned, with the newest label of its call.

    >>> look = SecondLook(delay=2)
    >>> look.push(1, b"a", 1.0, "call a"), look.push(2, b"b", 1.0, "call b")
    ([], [])
    >>> look.note(b"a", 0.0, corrected=True)  # a person: call a should have been blocked
    >>> look.push(3, b"c", 1.0, "call c")
    [DueLook(payload='call a', label=0.0, corrected=True)]
    """

    def __init__(self, delay: int) -> None:
        self.delay = delay
        self._queue: deque[tuple[int, bytes, Payload]] = deque()  # (seq, fingerprint, payload)
        #: fingerprint -> [newest label, how many queued examples have that fingerprint,
        #: whether the newest label is a correction's]
        self._newest: dict[bytes, list] = {}

    def __len__(self) -> int:
        return len(self._queue)

    def note(self, fingerprint: bytes, label: float, corrected: bool = False) -> None:
        """A fresh signal's label for its call (a correction's, `corrected`, or a later
        decision's): the pending second looks of the same call take it."""
        entry = self._newest.get(fingerprint)
        if entry is not None:
            entry[0], entry[2] = label, corrected

    def push(self, seq: int, fingerprint: bytes, label: float, payload: Payload,
             corrected: bool = False) -> list[DueLook[Payload]]:
        """Queue an example its learner has just learned (signal `seq`; `corrected`: its
        label is a correction's); return the looks now due, oldest first, each with the
        newest label of its call and whether that label is a correction's."""
        if self.delay <= 0:
            self.clear()
            return []
        entry = self._newest.setdefault(fingerprint, [label, 0, corrected])
        entry[0], entry[2] = label, corrected
        entry[1] += 1
        self._queue.append((seq, fingerprint, payload))
        due = []
        while len(self._queue) > self.delay:
            _, fp, old = self._queue.popleft()
            due.append(DueLook(old, *self._release(fp)))
        return due

    def forget_before(self, seq: int) -> int:
        """Drop the pending looks of signals before `seq` (a policy change began there:
        their labels are the old policy's); returns how many were dropped."""
        return len(self._take(lambda at: at < seq))

    def take_from(self, first: int, last: int | None = None) -> list[DueLook[Payload]]:
        """Release now, oldest first, the pending looks of signals `first` to `last`
        (inclusive; None: every later one), each with the newest label of its call.

        Why (docs/learning.md, "The new policy's second looks at once"): a drift alarm
        comes 33-91 signals after a policy change began; what was learned
        since its estimated start is the new policy's first evidence, learned once under
        the old policy's steps. Its second look, `delay` signals later, would come after
        the window in which the wide path adapts fastest has mostly passed."""
        hi = float("inf") if last is None else last
        return self._take(lambda at: first <= at <= hi)

    def _take(self, picked: Callable[[int], bool]) -> list[DueLook[Payload]]:
        """Take out of the queue, oldest first, the looks whose signal `picked` selects,
        each with the newest label of its call; the rest keep their order."""
        taken = [item for item in self._queue if picked(item[0])]
        self._queue = deque(item for item in self._queue if not picked(item[0]))
        return [DueLook(payload, *self._release(fp)) for _, fp, payload in taken]

    def clear(self) -> None:
        self._queue.clear()
        self._newest.clear()

    def _release(self, fingerprint: bytes) -> tuple[float, bool]:
        """One queued example of `fingerprint` leaves the queue; its newest label, and
        whether that label is a correction's."""
        entry = self._newest[fingerprint]
        entry[1] -= 1
        if entry[1] == 0:
            del self._newest[fingerprint]
        return entry[0], entry[2]
