"""The wide path's contradiction window: what a drift alarm lets the next examples do.

After a policy change the wide path's AdaGrad sums have grown over thousands of signals,
so the old policy's confident weights turn slowly. For the examples learned after an
alarm (`relax_contradicted`, opened by daemon/trainer/wide_path.py `adapt_to_drift`), a
label the learner's logit contradicts relaxes its buckets' sums (they step as if new),
and the weights it pushes against that nothing in the window has supported decay -- from
the second such label against them on (the alarm's own evidence at once, where its labels
are not mostly for them). Kept apart from the optimiser's arithmetic
(wide_learner.py) because it is a rule about evidence over many examples, not a step:
docs/learning.md "Relaxing what the new policy contradicts", "Decaying what only the
flipped calls read", "One wrong label in the window" and "The alarm's evidence by
majority".

A mixin of `WideAdaGrad`: it reads and writes the learner's weights `w`, its sums `g2`,
its array module `xp` and `_host`.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterable, Iterator

import numpy as np

#: `WideAdaGrad._decay_unsupported` leaves a weight whose part of the member's linear
#: logit pushes against the label by this much or less (measured in the harness: 0.3
#: kept the decay to the old policy's confident marks and shapes; at 0 every byte n-gram
#: of a flipped call decayed too, and the new policy's blocks were learned less by them)
CONTRA_DECAY_LEAST = 0.3


class ContradictionWindow:
    """The window's state and rules (see the module's docstring); closed until an alarm."""

    #: after a drift alarm: examples left whose contradicting labels relax their buckets'
    #: sums, by what factor, beyond which margin, the buckets relaxed already with what
    #: the relax took from each sum (`restore_window`), and the window's length when it
    #: opened (`relax_contradicted`)
    contra_left: int
    contra_factor: float
    contra_margin: float
    contra_done: dict[int, float]
    contra_examples: int
    #: ... the factor on the unsupported weights a contradicting label pushes against (1:
    #: off), how many such labels a weight waits for, the labels counted so far per bucket,
    #: the buckets an example of the window has supported, whether the examples learned
    #: now are the alarm's own evidence (`alarm_evidence`), and what the decay took from
    #: each bucket since the window opened (`restore_window`)
    contra_decay: float
    contra_votes: int
    contra_against: dict[int, int]
    contra_supported: set[int]
    contra_evidence: bool
    contra_removed: dict[int, float]

    def _close_window(self) -> None:
        """The state of a learner no alarm has opened a window for: a window of 0 examples."""
        self.contra_evidence = False
        self.relax_contradicted(1.0, 0, 0.0)

    def relax_contradicted(self, factor: float, examples: int, margin: float,
                           decay: float = 1.0, votes: int = 1) -> None:
        """For the next `examples` learned (signals, second looks, replays), an example
        whose label contradicts the logit by more than `margin` first multiplies the
        AdaGrad sums of its linear buckets by `factor`, each bucket once (a drift alarm
        calls it: `train.drift_wide_contra_relax`; `examples` 0 ends it), and with `decay`
        < 1 multiplies by `decay` the weights it pushes against that no example of the
        window has supported yet, from the `votes`-th such example on
        (`_decay_unsupported`; `train.drift_wide_contra_decay`, `_decay_votes`).

        Why (docs/learning.md, "Relaxing what the new policy contradicts"): after a policy
        change the host shapes and known names the old policy made confident (+2..+4 on
        calls the new one blocks) step by lr g / sqrt(G) with G summed over thousands of
        signals, so they turn slowly; relaxing every sum at the alarm turned them faster
        but let the new policy's first examples be learned by their own n-grams more than
        by the shapes an unseen value shares with them (block recall on unseen values
        fell). Here only the buckets of calls the new labels contradict get large steps
        again; the features that still hold keep their sums. Not checkpointed (as the bag's
        `learn_all_for`): a restart inside the window ends it."""
        self.contra_left, self.contra_factor = max(0, int(examples)), float(factor)
        self.contra_margin, self.contra_done = float(margin), {}
        self.contra_examples = self.contra_left
        self.contra_decay, self.contra_supported = float(decay), set()
        self.contra_votes, self.contra_against = max(1, int(votes)), {}
        self.contra_removed = {}

    def in_window_first(self, n: int) -> bool:
        """Whether the contradiction window is open and fewer than `n` of its examples
        are learned yet (`train.drift_wide_unscaled_examples`)."""
        return self.contra_left > 0 and self.contra_examples - self.contra_left < n

    def _relax_if_contradicted(self, st: dict, label: float) -> bool:
        """One example of `relax_contradicted`'s window: `st` is its `_gradient`. True if
        weights decayed (`st` is then stale: the step must be taken at the new weights)."""
        self.contra_left -= 1
        z = st["z"]
        contradicted = (z >= 0.0) != (label >= 0.5) and abs(z) > self.contra_margin
        decayed = False
        if self.contra_decay != 1.0:  # off: no support to keep either
            push = self._push(st, label)
            decayed = contradicted and self._decay_unsupported(st["idx"], push)
            if not self.contra_evidence:
                self.contra_supported.update(st["idx"][push > 0.0].tolist())
        if not contradicted:
            return False
        fresh = [j for j in st["idx"].tolist() if j not in self.contra_done]
        if fresh:
            d = self.xp.asarray(np.asarray(fresh, dtype=np.intp))
            sums = self.g2[d]
            taken = (1.0 - self.contra_factor) * self._host(sums).astype(np.float64)
            self.contra_done.update(zip(fresh, taken.tolist(), strict=True))
            self.g2[d] = sums * self.contra_factor
        return decayed

    @staticmethod
    def _push(st: dict, label: float) -> np.ndarray:
        """Each bucket's part of the linear logit of `st` (a `_gradient`), signed toward
        `label`: > 0 supports the label, < 0 pushes against it."""
        return st["w_now"] * st["val"] * (1.0 if label >= 0.5 else -1.0)

    @contextlib.contextmanager
    def alarm_evidence(self, evidence: Iterable[tuple] = ()) -> Iterator[None]:
        """What is learned inside is the alarm's own evidence: the second looks a drift
        alarm takes at once (`train.drift_look_now`), the labels from the change's
        estimated start to the alarm, given first as `evidence` ((idx, val, label,
        novel_at) each). It counts in the window and is contradicted as ever, and a label
        of it against a weight counts as all of the window's votes: the detector that
        raised the alarm on these labels is their corroboration (docs/learning.md, "One
        wrong label in the window") -- unless the evidence's labels for that weight
        outnumber those against it (`_evidence_majority`, read at the weights before any of
        it is learned): then the evidence supports it, and no label of the window decays it.

        Why the majority (docs/learning.md, "The alarm's evidence by majority"): the
        looks can start ~50 signals before the change, so one look at a time supports
        nothing (the old policy's labels among them, the known installs it allowed,
        supported the very weights the new policy's installs contradict). But a policy
        change's evidence is mostly against the weights it flips, while a bad spell of
        the gate is one wrong label among many right ones: seed 4's false alarm at 7,924
        held an uncorrected wrong block of an org-host GET beside allowed ones, and every
        allow-leaning weight of those calls decayed to 0 at once (four allowed calls to
        the org's hosts then served 0.32-0.49)."""
        before, self.contra_evidence = self.contra_evidence, True
        if self.contra_decay != 1.0:
            self.contra_supported.update(self._evidence_majority(evidence))
        try:
            yield
        finally:
            self.contra_evidence = before

    def _evidence_majority(self, evidence: Iterable[tuple]) -> list[int]:
        """The buckets whose weights more labels of `evidence` push toward (their part of
        the member's linear logit signed toward the label > 0) than against (< 0)."""
        balance: collections.Counter[int] = collections.Counter()
        for idx, val, label, novel_at in evidence:
            st = self._gradient(idx, val, 0.0, label, 1.0, None, novel_at)
            push = self._push(st, label)
            balance.update(st["idx"][push > 0.0].tolist())
            balance.subtract(st["idx"][push < 0.0].tolist())
        return [j for j, more_for in balance.items() if more_for > 0]

    def _decay_unsupported(self, idx: np.ndarray, push: np.ndarray) -> bool:
        """Multiply by `contra_decay` the linear weights of a contradicted example that push
        against its label by more than `CONTRA_DECAY_LEAST` logits, that no example of
        the window has supported (pushed toward its own label) yet, and that this is the
        `contra_votes`-th contradicted example of the window to push against (an example
        of the alarm's evidence, `alarm_evidence`, counts as all of them).

        Why (docs/learning.md, "Decaying what only the flipped calls read"): after a
        change that blocks every package install, the old policy's known-package mark
        (+2 logits toward "allow", learned from hundreds of allowed installs) is read by
        the installs alone, and the relaxed sums still turn it only ~0.3 a contradiction:
        five to seven blocked installs, more than the new policy's first 200 signals
        show. A weight that the calls the change kept also read (the shared n-grams,
        a tool's shapes) is supported by them and keeps its value; small weights (the
        byte n-grams one at a time) are left to the steps, which learn the new policy on
        the features an unseen value shares.

        Why the votes (docs/learning.md, "One wrong label in the window"): a policy
        change contradicts a weight with many calls, the gate's own mistake with one. At
        a single vote one wrong "block" of an allowed e-mail, 60 signals into the window
        and before any allowed e-mail there had supported them, took every e-mail's
        shapes and n-grams (+4.6 logits to ~0: seed 15's history rule 0.645 at the
        change's checkpoint). The alarm's evidence still decays at once: the labels the
        detector fired on are the change, and waiting for a second install after them
        left seed 2's installs allowed at the change's checkpoint. A second look or a
        replay of the same call counts again: votes count labels learned, not calls."""
        against = [j for j in idx[push < -CONTRA_DECAY_LEAST].tolist()
                   if j not in self.contra_supported]  # a few at most
        bad = []
        vote = self.contra_votes if self.contra_evidence else 1
        for j in against:
            self.contra_against[j] = seen = self.contra_against.get(j, 0) + vote
            if seen >= self.contra_votes:
                bad.append(j)
        if bad:
            d = self.xp.asarray(np.asarray(bad, dtype=np.intp))
            now = self._host(self.w[d]).astype(np.float64)
            self.w[d] = self.xp.asarray(now * self.contra_decay, dtype=self.w.dtype)
            for j, taken in zip(bad, (1.0 - self.contra_decay) * now, strict=True):
                self.contra_removed[j] = self.contra_removed.get(j, 0.0) + float(taken)
        return bool(bad)

    def restore_window(self) -> bool:
        """Give back what the window took since it opened -- the weights `_decay_unsupported`
        decayed and the sums `_relax_if_contradicted` relaxed -- keeping what was learned
        since (a withdrawn drift alarm: the contradicting labels were the gate's own
        mistakes, the weights they decayed were right, and the sums they relaxed had been
        earned). True if anything was given back.

        Why the sums too (docs/learning.md, "A withdrawn alarm gives its sums back"): a
        relaxed sum stays relaxed long after the window, since a feature the path already
        gets right sees gradients near 0 and its sum regrows slowly; its steps stay ~3x as
        large (x0.1 the sum). After seed 4's false alarm at 7,752 (eleven wrong blocks of the
        gate, corrected since) the shared shapes of `http.request` swung with single wrong
        labels for hundreds of signals: calls to a host the new policy blocks leaned
        "allow" (0.65) 400 signals later, a tie with the anchor at that checkpoint."""
        if not self.contra_removed and not any(self.contra_done.values()):
            return False
        self._give_back(self.w, self.contra_removed)
        self.contra_removed = {}
        # relaxed: g2 = factor * before + learned; adding (1 - factor) * before
        self._give_back(self.g2, self.contra_done)
        self.contra_done = dict.fromkeys(self.contra_done, 0.0)  # given back once
        return True

    def _give_back(self, table, taken: dict[int, float]) -> None:
        """Add `taken[j]` to row `j` of `table` (the learner's weights or sums, on its
        array module) for every `j` in `taken`."""
        if not taken:
            return
        rows = np.fromiter(taken, np.intp, len(taken))
        d = self.xp.asarray(rows)
        amounts = np.fromiter(taken.values(), np.float64, len(rows))
        table[d] = table[d] + self.xp.asarray(amounts, dtype=table.dtype)
