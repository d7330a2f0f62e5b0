"""Drift detection on the progressive-validation error stream: Page-Hinkley.

A policy change shows up as a sustained rise of the error rate of the serving model on
fresh signals (each scored before it is trained on). Page-Hinkley accumulates
m_t = sum (e_i - mean_i - delta) and alarms when m_t - min m > threshold: it ignores
isolated mistakes (a noisy gate) and fires within tens of signals of a jump from ~5% to
~25% errors. It also estimates where the change began (the index of min m), which the
trainer uses to stop replaying examples labelled under the old policy. Page-Hinkley's own
estimate (where the cumulative sum was lowest) wanders by hundreds of signals when the
error rate is low, so the start is re-estimated at the alarm by the best two-segment
Bernoulli split of the recent errors (maximum likelihood, one pass over cumulative sums).

A noisy gate can raise the error rate too: a burst of its own mistakes (the model right,
the gate's label wrong) looks like a policy change for the signals it lasts, and a person
corrects most of those mistakes some signals later. `AlarmRecheck` holds an alarm that
long and reruns the same test on the labels as corrected since: a policy change still
alarms (the gate's labels are right, they are the new policy), a burst of corrected
mistakes does not, and the alarm is withdrawn.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np


class PageHinkley:
    """One-sided (increase) Page-Hinkley test over a stream of 0/1 errors."""

    def __init__(self, delta: float = 0.01, threshold: float = 12.0,
                 min_samples: int = 200, memory: int = 2000) -> None:
        self.delta, self.threshold, self.min_samples = delta, threshold, min_samples
        self.detections = 0
        self._recent: deque[float] = deque(maxlen=memory)
        self.reset()

    def reset(self) -> None:
        """Start over (after an alarm: the new regime gets its own mean)."""
        self.n = 0
        self.mean = 0.0
        self.cum = 0.0
        self.cum_min = 0.0
        self.min_at = 0  # index (within this run) where the cumulative sum was lowest
        self._recent.clear()

    def update(self, error: float) -> int | None:
        """Add one observation; returns the estimated change index (observations since the
        last reset before the change began) when drift is detected, else None."""
        self.n += 1
        self._recent.append(error)
        self.mean += (error - self.mean) / self.n
        self.cum += error - self.mean - self.delta
        if self.cum < self.cum_min:
            self.cum_min, self.min_at = self.cum, self.n
        if self.n >= self.min_samples and self.cum - self.cum_min > self.threshold:
            start = self.n - len(self._recent) + self._best_split()
            self.detections += 1
            self.reset()
            return start
        return None

    def _best_split(self) -> int:
        """k maximising the two-segment Bernoulli log-likelihood of the recent errors
        (segment means before and after k), with the later segment's rate the higher."""
        x = np.asarray(self._recent, dtype=np.float64)
        n = x.size
        k = np.arange(1, n)
        ones = np.cumsum(x)[:-1]
        after = x.sum() - ones

        def ll(c: np.ndarray, m: np.ndarray) -> np.ndarray:
            q = np.clip(c / m, 1e-9, 1 - 1e-9)
            return c * np.log(q) + (m - c) * np.log(1 - q)

        score = ll(ones, k) + ll(after, n - k)
        score[after / (n - k) <= ones / k] = -np.inf  # only rises are drift
        return int(k[np.argmax(score)]) if np.isfinite(score).any() else self.min_at

    def _sums(self, errors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(n, cum) after each of `errors` from a reset: `update`'s sums, vectorised."""
        e = np.asarray(errors, dtype=np.float64)
        n = np.arange(1, e.size + 1)
        return n, np.cumsum(e - np.cumsum(e) / n - self.delta)

    def peak(self, errors: np.ndarray) -> float:
        """The test's largest statistic (m_t - min m) on `errors` (0/1) from a reset, over
        the observations where it may alarm (after `min_samples`): above `threshold`
        exactly when `first_alarm` alarms; else how far below it a rerun stayed
        (`AlarmRecheck.verdict`)."""
        n, cum = self._sums(errors)
        low = np.minimum(np.minimum.accumulate(cum), 0.0)
        stat = (cum - low)[n >= self.min_samples]
        return float(stat.max()) if stat.size else 0.0

    def first_alarm(self, errors: np.ndarray) -> int | None:
        """Index of the observation at which this test, started afresh, would alarm on
        `errors` (0/1), else None."""
        n, cum = self._sums(errors)
        low = np.minimum(np.minimum.accumulate(cum), 0.0)
        hits = np.flatnonzero((n >= self.min_samples) & (cum - low > self.threshold))
        return int(hits[0]) if hits.size else None

    def resume_from(self, errors: np.ndarray) -> None:
        """Take the state `update` reaches on `errors` from a reset, none of them an alarm
        (a withdrawn alarm: `CheckedTest._decide`)."""
        self.reset()
        e = np.asarray(errors, dtype=np.float64)
        if not e.size:
            return
        _, cum = self._sums(e)
        self.n, self.mean, self.cum = int(e.size), float(e.mean()), float(cum[-1])
        lowest = int(np.argmin(cum))
        if cum[lowest] < 0.0:
            self.cum_min, self.min_at = float(cum[lowest]), lowest + 1
        self._recent.extend(e[-self._recent.maxlen:].tolist())

    def state(self) -> dict:
        return {"n": self.n, "mean": self.mean, "cum": self.cum, "cum_min": self.cum_min,
                "min_at": self.min_at, "detections": self.detections}

    def load(self, state: dict | None) -> None:
        if state:
            for k, v in state.items():
                setattr(self, k, v)


#: observations of a test's run kept for its recheck (their seqs, labels, corrections)
RUN_MEMORY = 20_000


class AlarmRecheck:
    """An alarm held for `wait` more observations, then tested again on corrected labels.

    `run` is what the detector saw since its last reset up to the alarm, as (fingerprint,
    predicted block, labelled block), `seqs` their sequence numbers; `fixes` the
    corrections (fingerprint -> block) that arrived meanwhile. The wait's observations and
    corrections are added as they come; `verdict` reruns the detector's test over the run
    and the wait with every label replaced by its newest correction: still an alarm means
    the labels that raised it stand (a policy change), a statistic well under the
    threshold means the rise was mistakes that people have since corrected, and one in
    between is not decided yet (the caller waits again).
    """

    def __init__(self, detector: PageHinkley, run: list[tuple[bytes, bool, bool]],
                 seqs: list[int], fixes: dict[bytes, bool], began_seq: int,
                 wait: int) -> None:
        self.detector, self.began_seq, self.left = detector, began_seq, wait
        self.waits = 0  # waits over (`CheckedTest` may wait again)
        self.run, self.seqs, self.fixes = run, seqs, dict(fixes)

    def add(self, seq: int, fingerprint: bytes, pred_block: bool, label_block: bool) -> None:
        """One more observation of the wait (corrections go into `fixes`)."""
        self.run.append((fingerprint, pred_block, label_block))
        self.seqs.append(seq)
        self.left -= 1

    @property
    def due(self) -> bool:
        return self.left <= 0

    def corrected_errors(self) -> np.ndarray:
        return np.fromiter((pred != self.fixes.get(fp, label) for fp, pred, label in self.run),
                           dtype=np.float64, count=len(self.run))

    def verdict(self, withdraw_below: float = 1.0) -> bool | None:
        """True: confirmed (the corrected rerun still alarms); False: withdrawn (its
        statistic stayed under `withdraw_below` x the threshold); None: in between, not
        decided. Why a margin: a real change that began inside a burst of the gate's own
        mistakes loses the burst to its corrections, and its own rise may not have reached
        the threshold in one wait (docs/learning.md "A drift verdict with a margin")."""
        peak = self.detector.peak(self.corrected_errors())
        if peak > self.detector.threshold:
            return True
        return False if peak <= withdraw_below * self.detector.threshold else None


class CheckedTest:
    """A Page-Hinkley test over (prediction, label) pairs whose alarms wait for corrections.

    `observe` feeds the test the error of each observation and keeps the run since the
    test's last reset (sequence numbers, fingerprints, corrections). At an alarm it returns
    the sequence number where the change began and holds an `AlarmRecheck` for `wait`
    observations; its verdict, (began seq, confirmed), is then in `take_verdicts`. A rerun
    between `withdraw_below` x the threshold and the threshold waits again, at most
    `max_waits` waits in all; at the last, the threshold decides, as with one wait
    (confirming the undecided ones instead withdrew 26-31 of 40 synthetic long spells of
    the gate's mistakes, against 39: docs/learning.md "A drift verdict with a margin").
    Without a wait, or when part of the run is missing (after a restart, or past
    `RUN_MEMORY`), the verdict is "confirmed" at once: nothing can withdraw what cannot be
    rechecked.
    """

    def __init__(self, test: PageHinkley, wait: int, withdraw_below: float = 1.0,
                 max_waits: int = 1) -> None:
        self.test, self.wait = test, wait
        self.withdraw_below, self.max_waits = withdraw_below, max_waits
        self._seqs: deque[int] = deque(maxlen=RUN_MEMORY)
        self._records: deque[tuple[bytes, bool, bool]] = deque(maxlen=RUN_MEMORY)
        self._fixes: OrderedDict[bytes, bool] = OrderedDict()
        self._run = 0  # observations since the test's last reset
        self._complete = True  # all of the run is in `_records`
        self.recheck: AlarmRecheck | None = None
        self._verdicts: deque[tuple[int, bool]] = deque()
        self.withdrawn = 0

    def correct(self, fingerprint: bytes, label_block: bool) -> None:
        """A correction of that call's label (observed by this test or not)."""
        if self.recheck is not None:
            self.recheck.fixes[fingerprint] = label_block
        self._fixes[fingerprint] = label_block
        self._fixes.move_to_end(fingerprint)
        if len(self._fixes) > RUN_MEMORY:
            self._fixes.popitem(last=False)

    def observe(self, seq: int, fingerprint: bytes, pred_block: bool, label_block: bool,
                correction: bool) -> int | None:
        """One observation; the seq where the change began when it raises an alarm."""
        if correction:
            self.correct(fingerprint, label_block)
        if self.recheck is not None:
            self.recheck.add(seq, fingerprint, pred_block, label_block)
            if self.recheck.due and not self._decide():
                return None  # withdrawn: the run goes on from before the spell
        if len(self._records) == RUN_MEMORY:
            self._complete = False
        self._records.append((fingerprint, pred_block, label_block))
        self._seqs.append(seq)
        self._run += 1
        start = self.test.update(float(pred_block != label_block))
        if start is None:
            return None
        # `start` observations of this run came before the change; the deque holds the
        # last len(_seqs) of the run's `_run` observations.
        i = max(0, min(len(self._seqs) - 1, start - (self._run - len(self._seqs))))
        began = self._seqs[i]
        if self.recheck is not None:  # a second alarm while one waits: both stand
            self._verdicts.append((self.recheck.began_seq, True))
            self.recheck = None
        if self.wait <= 0 or not self._complete:
            self._verdicts.append((began, True))
        else:
            self.recheck = AlarmRecheck(self.test, list(self._records), list(self._seqs),
                                        self._fixes, began, self.wait)
        self._seqs.clear()
        self._records.clear()
        self._fixes.clear()
        self._run = 0
        self._complete = True
        return began

    def _decide(self) -> bool:
        """The waiting alarm's verdict, or another wait (False only when withdrawn: True
        when confirmed or still waiting). Withdrawn, the run it interrupted
        goes on from where the rise began, as the test saw it: the spell of the gate's
        mistakes left out, the rate before it the baseline again (a real change right after
        is measured against it, not hidden in a fresh run that would start with it)."""
        recheck = self.recheck
        verdict = recheck.verdict(self.withdraw_below)
        recheck.waits += 1
        if verdict is None and recheck.waits < self.max_waits:
            recheck.left = self.wait  # not decided: wait for more corrections
            return True
        self.recheck = None
        confirmed = verdict is True  # the last wait: the threshold decides
        self._verdicts.append((recheck.began_seq, confirmed))
        if not confirmed:
            self.withdrawn += 1
            k = next((i for i, q in enumerate(recheck.seqs) if q >= recheck.began_seq),
                     len(recheck.seqs))
            run = recheck.run[:k]
            self.test.resume_from(np.array([pred != label for _, pred, label in run], float))
            self._records = deque(run, maxlen=RUN_MEMORY)
            self._seqs = deque(recheck.seqs[:k], maxlen=RUN_MEMORY)
            self._fixes = OrderedDict(recheck.fixes)
            self._run = k
            self._complete = k <= RUN_MEMORY
        return confirmed

    def take_verdicts(self) -> list[tuple[int, bool]]:
        """(began seq, confirmed) of each alarm decided since the last call, oldest first."""
        out = list(self._verdicts)
        self._verdicts.clear()
        return out

    @property
    def pending(self) -> bool:
        """An alarm is waiting for corrections."""
        return self.recheck is not None

    def state(self) -> dict:
        return {"withdrawn": self.withdrawn,
                "pending_began": None if self.recheck is None else self.recheck.began_seq}

    def load(self, state: dict | None) -> None:
        """After a restart: the run's observations are not checkpointed, so an alarm that
        was waiting stands, and so does the next alarm of this run."""
        state = state or {}
        self.withdrawn = int(state.get("withdrawn", 0))
        self._complete = not self.test.n
        if state.get("pending_began") is not None:
            self._verdicts.append((int(state["pending_began"]), True))
