"""The online-learning verbs: drift detection (Page-Hinkley, the monitor's alarms and their
verdicts), corrected alignment, the allow band's guard and the second looks.
Calibration: test_calibration.py; the replay reservoir's supersession:
test_replay_supersession.py."""

from __future__ import annotations

import random

import numpy as np

from gated.daemon.serving import Bands
from gated.online import CorrectedAlignment, PageHinkley
from gated.online.drift import CheckedTest
from gated.online.monitor import Monitor, MonitorSettings
from gated.online.second_look import SecondLook


def _errors(rng: random.Random, rate: float, n: int) -> list[float]:
    return [float(rng.random() < rate) for _ in range(n)]


def test_page_hinkley_fires_soon_after_a_jump_and_locates_it():
    rng = random.Random(0)
    ph = PageHinkley()
    stream = _errors(rng, 0.05, 1500) + _errors(rng, 0.30, 500)
    alarms = [(i, s) for i, e in enumerate(stream) if (s := ph.update(e)) is not None]
    assert alarms, "a jump from 5% to 30% errors must be detected"
    at, start = alarms[0]
    assert 1500 <= at <= 1500 + 150
    assert abs(start - 1500) <= 80  # the change point estimate


def test_page_hinkley_stays_quiet_on_a_noisy_but_stationary_gate():
    for seed in range(5):
        rng = random.Random(seed)
        ph = PageHinkley()
        assert all(ph.update(e) is None for e in _errors(rng, 0.06, 6000)), seed
    # ...and on a learning curve: errors that FALL are not drift
    rng = random.Random(9)
    ph = PageHinkley()
    falling = [float(rng.random() < 0.5 * np.exp(-i / 500)) for i in range(4000)]
    assert all(ph.update(e) is None for e in falling)


def test_corrected_alignment_relabels_the_predictions_of_a_corrected_call():
    w = CorrectedAlignment(10)
    a, b = b"a" * 16, b"b" * 16
    w.add(a, 0.9, 1.0)  # predicted allow, gate said allow
    w.add(b, 0.2, 0.0)
    assert w.alignment == 1.0
    assert w.correct(a, 0.0) == 1  # a person: that call was harmful
    assert w.alignment == 0.5


def test_monitor_reports_drift_with_the_signal_where_it_began():
    mon = Monitor(MonitorSettings(drift_adapt_signals=100))
    rng = random.Random(1)
    fp = b"x" * 16
    began = None
    for seq in range(1, 2500):
        wrong = rng.random() < (0.05 if seq < 2000 else 0.35)
        p, label = (0.9, 0.0) if wrong else (0.9, 1.0)
        out = mon.observe(seq, fp, None, label, 2.0, p)
        if out is not None:
            began, at = out, seq
            break
    assert began is not None and abs(began - 2000) <= 80 and mon.adapting
    assert mon.stats()["drift_detections"] == 1.0 and at > began


def test_first_alarm_is_the_streaming_tests_alarm_vectorised():
    """`PageHinkley.first_alarm` (the recheck's rerun) alarms where `update` would."""
    for seed in range(6):
        rng = random.Random(seed)
        stream = _errors(rng, 0.04, 700 + 100 * seed) + _errors(rng, 0.2 + 0.03 * seed, 400)
        ph = PageHinkley()
        streaming = next((i for i, e in enumerate(stream) if ph.update(e) is not None), None)
        assert streaming is not None and PageHinkley().first_alarm(stream) == streaming, seed
    quiet = _errors(random.Random(7), 0.05, 3000)
    assert PageHinkley().first_alarm(quiet) is None
    streamed, resumed = PageHinkley(), PageHinkley()
    for e in quiet:
        streamed.update(e)
    resumed.resume_from(np.array(quiet))  # where a withdrawn alarm's test goes on from
    got, want = resumed.state(), streamed.state()
    assert got.keys() == want.keys() and got["n"] == want["n"] == 3000
    assert got["min_at"] == want["min_at"] and list(resumed._recent) == list(streamed._recent)
    assert np.allclose([got[k] for k in ("mean", "cum", "cum_min")],
                       [want[k] for k in ("mean", "cum", "cum_min")], rtol=1e-9, atol=1e-9)
    assert PageHinkley().first_alarm([1.0] * 150) is None  # before min_samples, never


def _burst_then(mon: Monitor, rng: random.Random, *, policy_change: bool,
                corrected: float) -> tuple[int, int, tuple[bool, bool]]:
    """800 calls the model gets right under a gate wrong 3% of the time, then either a
    policy change (from 800 on, 30% of the labels flip and stand: the model contradicts
    them) or a bad spell of the gate (wrong on 15% of the calls 800-1099, the model right).
    A person corrects `corrected` of the gate's mistakes 5-45 signals later (a signal of
    the same call); a policy change's labels are not mistakes. Returns the seq of the
    first alarm, the seq by which it was decided, and (adapting, allow band open) then."""
    due: dict[int, list[bytes]] = {}
    alarm = decided = 0
    then = (False, False)
    for seq in range(1, 1400):
        fp = seq.to_bytes(16, "big")
        changed = policy_change and seq >= 800 and rng.random() < 0.3
        mistake = rng.random() < (0.15 if not policy_change and 800 <= seq < 1100 else 0.03)
        if mistake and rng.random() < corrected:
            due.setdefault(seq + rng.randint(5, 45), []).append(fp)
        label = 0.0 if changed != mistake else 1.0
        # p 0.8: below the allow band (0.9), so its guard stays out of this
        if mon.observe(seq, fp, None, label, 1.4, 0.8) is not None and not alarm:
            alarm = seq
        for fix in due.pop(seq, []):  # a person: that call was fine
            mon.observe(seq, fix, "false_positive", 1.0, 1.4, 0.8)
        if alarm and not decided and not mon.drift_pending:
            decided, then = seq, (mon.adapting, mon.allow_band_open)
    return alarm, decided, then


def test_a_bad_spell_of_the_gate_is_withdrawn_a_policy_change_confirmed():
    """The alarm waits `drift_confirm_signals` observations, then reruns the test on the
    corrected labels: the gate's mistakes, corrected since, no longer rise (withdrawn:
    adaptation ends; the allow band's hold stays, `ask` being the cautious answer); a
    policy change's labels stand (confirmed); so do uncorrected mistakes (nothing says
    they were wrong)."""
    s = MonitorSettings(allow_band_after=0, allow_band_drift_hold=300, drift_confirm_signals=50)
    for seed in range(4):
        mon = Monitor(s)
        alarm, decided, then = _burst_then(mon, random.Random(seed), policy_change=False,
                                           corrected=0.8)
        assert 800 < alarm < 1100 and decided > alarm, seed
        verdicts = mon.take_verdicts()
        assert not verdicts[0][1] and abs(verdicts[0][0] - 800) < 100, (seed, verdicts)
        assert then == (False, False)  # adaptation ended; the band's hold stays (safety)
        # The spell goes on (300 calls): its mistakes not corrected yet may raise the alarm
        # again, and the fifth of them never corrected may, in the end, bear it out.
        assert mon.stats()["drift_withdrawn"] >= 1 and len(verdicts) == mon.drift.detections
        changed = Monitor(s)
        alarm, decided, _ = _burst_then(changed, random.Random(seed), policy_change=True,
                                        corrected=0.8)
        first = changed.take_verdicts()[0]
        assert 800 < alarm < decided and first[1] and abs(first[0] - 800) < 100, seed
        uncorrected = Monitor(s)
        _burst_then(uncorrected, random.Random(seed), policy_change=False, corrected=0.0)
        assert [c for _, c in uncorrected.take_verdicts()] == [True], seed


def _spell_then(withdraw_below: float, max_waits: int, *, change: bool
                ) -> tuple[list[tuple[int, int]], list[tuple[int, int, bool]]]:
    """400 calls at 3% errors, a 30-call spell of the gate's mistakes (each corrected 20
    calls later), then a policy change (25% errors that stand) or the old rate again;
    deterministic. Returns the alarms (seq, began) and verdicts (at seq, began, confirmed)
    of a `CheckedTest` with that margin and those waits."""
    check = CheckedTest(PageHinkley(0.01, 12.0, 200), 50, withdraw_below, max_waits)
    alarms, verdicts, fixes = [], [], {}
    for seq in range(1, 1000):
        fp = seq.to_bytes(8, "big")
        if 400 <= seq < 430:
            error = seq % 3 != 0
            if error:
                fixes.setdefault(seq + 20, []).append(fp)
        else:
            error = seq % 4 == 0 if change and seq >= 430 else seq % 33 == 0
        began = check.observe(seq, fp, False, error, False)  # the model says allow
        if began is not None:
            alarms.append((seq, began))
        for fix in fixes.pop(seq, []):
            check.correct(fix, False)
        verdicts += [(seq, *v) for v in check.take_verdicts()]
    return alarms, verdicts


def test_a_drift_verdict_with_a_margin_waits_again_when_the_rerun_is_undecided():
    """A policy change that begins right after a spell of the gate's mistakes: the alarm
    rises in the spell, the corrections take the spell away, and 50 calls of the change
    alone do not reach the threshold. One wait withdraws it (the old policy's replay comes
    back until a second alarm ~100 calls later); with a margin (withdraw at once only at
    or under half the threshold) the rerun is undecided, waits again and is confirmed at
    the next look. The spell alone is withdrawn either way (its rerun stays well under)."""
    alarms, verdicts = _spell_then(1.0, 1, change=True)
    assert [v[2] for v in verdicts] == [False, True] and verdicts[1][0] > alarms[0][0] + 100
    alarms, verdicts = _spell_then(0.5, 2, change=True)
    assert len(alarms) == 1 and 400 <= alarms[0][0] < 430  # raised in the spell
    (at, began, confirmed), = verdicts
    assert confirmed and began == alarms[0][1] and at == alarms[0][0] + 100  # second look
    for margin, waits in ((1.0, 1), (0.5, 2)):
        alarms, verdicts = _spell_then(margin, waits, change=False)
        assert len(alarms) == 1 and verdicts == [(alarms[0][0] + 50, alarms[0][1], False)]
    # A long spell (`_burst_then`: 300 calls, a fifth of its mistakes never corrected)
    # whose rerun is undecided at the first look: it waits again, and at the last wait
    # the threshold decides, as with one wait (withdrawn), instead of confirming it.
    waited = 0
    for seed in range(4):
        mon = Monitor(MonitorSettings(allow_band_after=0))  # the defaults: 0.5, two waits
        alarm, decided, _ = _burst_then(mon, random.Random(seed), policy_change=False,
                                        corrected=0.8)
        assert not mon.take_verdicts()[0][1], seed
        waited += decided - alarm > mon.settings.drift_confirm_signals + 10
    assert waited >= 1  # the second wait was taken (and still withdrew)


def test_the_tests_peak_is_its_alarm():
    """`PageHinkley.peak` (how far the statistic rose) is above the threshold exactly when
    `first_alarm` finds an alarm, on random error streams of several rates."""
    rng = np.random.default_rng(3)
    test = PageHinkley(0.01, 12.0, 200)
    alarmed = []
    for rate in (0.02, 0.05, 0.1):
        for _ in range(20):
            errors = (rng.random(600) < np.r_[np.full(300, 0.03), np.full(300, rate)]) * 1.0
            alarmed.append(test.peak(errors) > test.threshold)
            assert alarmed[-1] == (test.first_alarm(errors) is not None)
    assert 0 < sum(alarmed) < len(alarmed)  # both outcomes were checked


def test_after_a_withdrawn_alarm_a_policy_change_is_still_measured_against_the_old_rate():
    """A withdrawn alarm's test goes on from its corrected run (`PageHinkley.resume_from`),
    not from a reset: a policy change right after it alarms as soon as it would have
    without the spell, instead of hiding in a fresh run that starts with it (200
    observations before a fresh run may alarm, its mean then the new rate)."""
    rng = random.Random(4)
    mon = Monitor(MonitorSettings(drift_confirm_signals=50))
    due: dict[int, list[bytes]] = {}
    alarms = []
    for seq in range(1, 1300):
        fp = seq.to_bytes(16, "big")
        mistake = rng.random() < (0.5 if 800 <= seq < 840 else 0.03)
        changed = seq >= 950 and rng.random() < 0.3
        if mistake:
            due.setdefault(seq + rng.randint(5, 30), []).append(fp)
        if mon.observe(seq, fp, None, 0.0 if changed != mistake else 1.0, 2.0, 0.9):
            alarms.append(seq)
        for fix in due.pop(seq, []):
            mon.observe(seq, fix, "false_positive", 1.0, 2.0, 0.9)
    verdicts = mon.take_verdicts()
    assert alarms[0] < 850 and not verdicts[0][1], (alarms, verdicts)
    change = [(a, v) for a, v in zip(alarms, verdicts, strict=False) if a > 950]
    assert change and change[0][0] < 1000 and change[0][1][1], (alarms, verdicts)


def test_without_a_wait_or_after_a_restart_an_alarm_is_confirmed_at_once():
    """`drift_confirm_signals` 0: the verdict comes with the alarm. A restart while an alarm
    waits: the run's observations are not checkpointed, the alarm stands."""
    now = Monitor(MonitorSettings(drift_confirm_signals=0))
    alarm, decided, _ = _burst_then(now, random.Random(0), policy_change=False, corrected=0.8)
    assert alarm == decided and [c for _, c in now.take_verdicts()] == [True]
    mon = Monitor(MonitorSettings(drift_confirm_signals=10_000))  # still waiting at the end
    _burst_then(mon, random.Random(0), policy_change=False, corrected=0.8)
    assert mon.drift_pending and mon.take_verdicts() == []
    again = Monitor(MonitorSettings(drift_confirm_signals=10_000))
    again.load(mon.state())
    assert again.take_verdicts() == [(mon.last_drift_seq, True)] and not again.drift_pending


def test_the_allow_band_waits_for_evidence_and_holds_after_a_drift():
    """Closed until `allow_band_after` signals are scored; closed again for
    `allow_band_drift_hold` scored signals after an alarm; the hold and the count survive
    a restart (state / load)."""
    s = MonitorSettings(allow_band_after=50, allow_band_drift_hold=40, drift_adapt_signals=10)
    mon = Monitor(s)
    rng = random.Random(2)
    fp = b"x" * 16
    opened_at = alarm_at = reopened_at = None
    for seq in range(1, 3000):
        if mon.allow_band_open and opened_at is None:
            opened_at = seq - 1  # scored before this one
        wrong = rng.random() < (0.02 if seq < 1000 else 0.4)
        if mon.observe(seq, fp, None, 0.0 if wrong else 1.0, 2.0, 0.9) is not None:
            alarm_at = seq
            assert not mon.allow_band_open and mon.stats()["allow_band_open"] == 0.0
            saved = mon.state()
            again = Monitor(s)
            again.load(saved)  # a restart in the middle of the hold
            assert not again.allow_band_open and saved["allow_hold_left"] == 40
            break
    assert opened_at == 50 and alarm_at is not None and alarm_at > 1000
    for seq in range(alarm_at + 1, alarm_at + 100):
        mon.observe(seq, fp, None, 1.0, 2.0, 0.9)
        if mon.allow_band_open and reopened_at is None:
            reopened_at = seq - alarm_at
    assert reopened_at == 40 and mon.stats()["allow_band_open"] == 1.0
    fresh = Monitor(s)
    fresh.load(mon.state())  # the calibrator's count comes back: open at once
    assert fresh.allow_band_open


def test_the_allow_bands_guard_closes_it_when_the_gate_blocks_what_it_would_allow():
    """A policy change that blocks calls the model still puts in the allow band: the
    band's own guard (the gate's blocks among those calls) closes it within tens of
    signals, before the detector on every call; calls outside the band do not feed it."""
    s = MonitorSettings(allow_band_after=0, allow_band_drift_hold=100)
    mon = Monitor(s)
    rng = random.Random(5)
    fp = b"y" * 16
    closed_at = None
    for seq in range(1, 1400):
        changed = seq > 1000
        if seq % 2:  # a call outside the band (p 0.2), blocked: never counted by the guard
            mon.observe(seq, fp, None, 0.0, -1.4, 0.2)
            continue
        blocked = rng.random() < (0.35 if changed else 0.05)
        mon.observe(seq, fp, None, 0.0 if blocked else 1.0, 3.0, 0.95)
        if not mon.allow_band_open:
            closed_at = seq
            break
        assert changed or mon.stats()["allow_guard_alarms"] == 0, seq  # no false alarm
    assert closed_at is not None and 1000 < closed_at <= 1100, closed_at
    assert mon.stats()["allow_guard_alarms"] == 1.0 and mon.drift.detections == 0
    assert mon.state()["allow_hold_left"] == 100


def test_a_reloaded_bands_allow_moves_the_guard_and_restarts_its_test():
    """After `bands.allow` is reloaded the guard counts the calls of the new band (p 0.85
    is in it at 0.8, not at 0.9) and its Page-Hinkley test starts over: the old band's
    rate of blocks is no baseline for a wider band. The same value again changes nothing."""
    mon = Monitor(MonitorSettings(allow_band_after=0))
    fp = b"z" * 16
    mon.observe(1, fp, None, 1.0, 3.0, 0.95)  # in the band at 0.9: counted
    mon.observe(2, fp, None, 0.0, 1.7, 0.85)  # not in it
    assert mon.allow_guard.n == 1
    mon.watch_allow_band(0.9)  # unchanged: nothing restarts
    assert mon.allow_guard.n == 1
    mon.watch_allow_band(0.8)
    assert mon.allow_guard.n == 0 and mon.stats()["allow_guard_band"] == 0.8
    mon.observe(3, fp, None, 0.0, 1.7, 0.85)  # now in the band
    mon.observe(4, fp, None, 1.0, -1.4, 0.2)
    assert mon.allow_guard.n == 1 and mon.allow_guard.mean == 1.0


def test_a_closed_allow_band_answers_ask_and_leaves_the_others():
    bands = Bands(allow=0.9, block=0.1)
    assert [bands.of(p) for p in (0.95, 0.5, 0.05)] == ["allow", "ask", "block"]
    assert [bands.of(p, allow_open=False) for p in (0.95, 0.5, 0.05)] == ["ask", "ask", "block"]


def test_second_look_is_due_after_its_delay_under_the_newest_label_of_its_call():
    look: SecondLook[str] = SecondLook(delay=2)
    assert look.push(1, b"x", 1.0, "x") == [] and look.push(2, b"y", 1.0, "y") == []
    look.note(b"x", 0.0)  # a correction of call x arrives before its second look
    look.note(b"unqueued", 0.0)  # a call with no pending look: nothing to relabel
    assert look.push(3, b"z", 1.0, "z") == [("x", 0.0, False)]
    assert look.push(4, b"w", 0.0, "w") == [("y", 1.0, False)]
    assert len(look) == 2


def test_second_look_of_a_call_queued_twice_takes_the_newest_label_for_both():
    look: SecondLook[str] = SecondLook(delay=2)
    look.push(1, b"x", 1.0, "first")  # the gate's mistaken allow
    look.push(2, b"x", 0.0, "correction")  # the correction: same call, now block
    assert look.push(3, b"y", 1.0, "y") == [("first", 0.0, False)]
    assert look.push(4, b"z", 1.0, "z") == [("correction", 0.0, False)]
    look.note(b"x", 1.0)  # no look of x is pending any more: x's label is forgotten
    assert look.push(5, b"x", 0.0, "again") == [("y", 1.0, False)]
    assert [look.push(6 + k, b"p", 1.0, "p")[0] for k in range(2)] == [("z", 1.0, False),
                                                                      ("again", 0.0, False)]


def test_second_look_says_whether_its_label_is_a_correction():
    """A look is due with `corrected` True when the newest label of its call came from a
    correction (pushed or noted as one), and False again when the gate decided the call
    once more after it: the trainer doubts only the gate's own labels."""
    look: SecondLook[str] = SecondLook(delay=2)
    look.push(1, b"x", 1.0, "x")  # the gate's allow
    look.push(2, b"y", 0.0, "y")
    look.note(b"x", 0.0, corrected=True)  # a person: block
    assert look.push(3, b"x", 0.0, "x, corrected", corrected=True) == [("x", 0.0, True)]
    look.note(b"x", 1.0)  # the gate allows the call again: its own label now
    assert look.push(4, b"z", 1.0, "z") == [("y", 0.0, False)]
    assert look.push(5, b"w", 1.0, "w") == [("x, corrected", 1.0, False)]


def test_second_looks_from_a_policy_changes_start_are_taken_at_once_under_their_newest_label():
    """`take_from(first, last)`: the looks of signals first..last leave the queue now, in
    order, each with the newest label of its call; the ones before and after stay on
    their schedule."""
    look: SecondLook[int] = SecondLook(delay=10)
    for seq in range(1, 7):
        look.push(seq, bytes([seq]), 1.0, seq)
    look.note(bytes([4]), 0.0, corrected=True)  # a person: signal 4's call is blocked
    assert look.take_from(3, 5) == [(3, 1.0, False), (4, 0.0, True), (5, 1.0, False)]
    assert len(look) == 3 and look.take_from(3, 5) == []  # each look is taken once
    assert look.take_from(6) == [(6, 1.0, False)]  # no last: every later one
    assert look.forget_before(3) == 2 and len(look) == 0


def test_second_look_drops_what_came_before_a_policy_change_and_turns_off_at_zero():
    look: SecondLook[int] = SecondLook(delay=5)
    for seq in range(1, 6):
        look.push(seq, bytes([seq]), 1.0, seq)
    assert look.forget_before(4) == 3 and len(look) == 2
    assert look.push(6, b"\x06", 1.0, 6) == []  # 3 pending: none due yet
    look.delay = 0  # the operator turned it off (a hot setting)
    assert look.push(7, b"\x07", 1.0, 7) == [] and len(look) == 0
