"""The ``[train]`` section: the trainer's optimiser, losses, replay, drift and wide-path keys.

Kept apart from gated/config/schema.py because it is most of the config (every learning
default the benchmarks chose is here, with its meaning); it is a section like the others,
declared through :func:`gated.config.fields._opt` and listed in ``schema.SECTIONS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .fields import _opt


@dataclass(frozen=True)
class TrainConfig:
    lr: float = _opt(1e-3, "AdamW learning rate", hot=True, lo=0.0, lo_open=True, hi=1.0)
    lambda_bce: float = _opt(1.0, "weight of the gate BCE loss", hot=True, lo=0.0)
    lambda_ce: float = _opt(0.5, "weight of the reason cross-entropy loss", hot=True, lo=0.0)
    lambda_ewc: float = _opt(0.0, "online EWC strength; 0 = off", hot=True, lo=0.0)
    ewc_decay: float = _opt(0.99, "decay of the EWC Fisher running mean", lo=0.0,
                            lo_open=True, hi=1.0, hi_open=True)
    weight_decay: float = _opt(0.01, "AdamW decoupled weight decay", hot=True, lo=0.0,
                               hi=1.0, hi_open=True)
    clip_norm: float = _opt(1.0, "global gradient-norm clip; 0 = off", hot=True, lo=0.0)
    warmup_steps: int = _opt(0, "linear LR warmup steps; 0 = none", lo=0)
    cosine_steps: int = _opt(0, "cosine LR decay steps after warmup; 0 = constant LR",
                             lo=0)
    batch_size: int = _opt(16, "examples per training step (fresh + replayed)", hot=True,
                           lo=1, hi=4096)
    replay_fraction: float = _opt(0.5, "share of each batch drawn from the replay "
                                  "reservoir", hot=True, lo=0.0, hi=1.0, hi_open=True)
    replay_slots: int = _opt(10000, "replay reservoir size", lo=1, hi=10_000_000)
    idle_steps_per_second: float = _opt(1.0, "replay-only steps per second when no fresh "
                                        "signals wait; 0 = none", hot=True, lo=0.0,
                                        hi=1000.0)
    swap_every_steps: int = _opt(10, "publish trained weights every N steps", hot=True,
                                 lo=1)
    swap_every_seconds: float = _opt(1.0, "...or every T seconds with new steps", hot=True,
                                     lo=0.0, lo_open=True)
    swap_soon_seconds: float = _opt(0.2, "after a call labelled block that serving "
                                    "answered `ask` with p_allow >= 0.5 (or any p_allow >= "
                                    "0.5 when a person corrected it), past the warm-up "
                                    "(allow_band_after), publish this many seconds after "
                                    "the last publication (not swap_every_seconds); 0 = off",
                                    hot=True, lo=0.0)
    checkpoint_every_steps: int = _opt(50, "commit a checkpoint every N steps", hot=True,
                                       lo=1)
    alignment_window: int = _opt(1000, "signals in the progressive-validation window",
                                 lo=1, hi=1_000_000)
    converged_threshold: float = _opt(0.95, "alignment at which the model counts as "
                                      "converged", hot=True, lo=0.0, lo_open=True, hi=1.0)
    fresh_per_step: int = _opt(256, "fresh signals read and scored per step at most; the "
                               "hardest of them are trained on (selective backprop)",
                               hot=True, lo=1, hi=4096)
    selective_confidence: float = _opt(0.9, "a fresh signal whose label the serving model "
                                       "already gives this calibrated probability is not "
                                       "back-propagated (unless sampled); 1 = train on all",
                                       hot=True, lo=0.5, hi=1.0)
    selective_keep: float = _opt(0.1, "share of the confidently right fresh signals still "
                                 "trained on", hot=True, lo=0.0, hi=1.0)
    step_chunk_rows: int = _opt(8, "a training batch is processed in length-sorted chunks of "
                                "this many rows, each padded to its own longest source (same "
                                "loss and gradient, less padding); 0 = one piece", hot=True,
                                lo=0, hi=4096)
    step_cores: int = _opt(0, "CPU: a step's chunks run this many at once, one per core "
                           "with one BLAS thread each (the same gradient; faster than "
                           "BLAS's threads on chunk-sized GEMMs); 0 = the trainer process's "
                           "threads (daemon.trainer_threads), 1 = one chunk at a time",
                           lo=0, hi=256)
    wide_lr: float = _opt(0.5, "AdaGrad learning rate of the wide (hashed n-gram) path, "
                          "which learns from every fresh signal (0.3 with wide_l2 3e-3 was "
                          "tried and not kept: docs/learning.md, 'The wide path's rate')",
                          hot=True, lo=0.0, hi=100.0)
    wide_l2: float = _opt(1e-3, "L2 penalty of the wide path's weights (1e-3: the sweep in "
                          "docs/learning.md; it is what lets unseen values fall back on "
                          "the shared features)", hot=True, lo=0.0)
    wide_replay: int = _opt(0, "examples from the replay reservoir the wide path learns "
                            "again per fresh signal (the reservoir's, relabelled by "
                            "corrections and dropped after a drift); 0 = one pass over the "
                            "stream (measured better after a policy change: "
                            "docs/learning.md). Ignored with wide_residual", hot=True, lo=0,
                            hi=16)
    wide_second_look: int = _opt(200, "the wide path learns every signal once more this "
                                 "many signals later, under the newest label of its call "
                                 "(a correction's), at weight 1; 0 = off (200: the sweep "
                                 "in docs/learning.md, 'A second look'). Ignored with "
                                 "wide_residual; each pending look holds its signal's "
                                 "features, 5-15 KB", hot=True, lo=0, hi=10_000)
    wide_pair_hold: float = _opt(3.0, "an 'allow' label the wide path's pair term "
                                 "contradicts (it says 'block' by more than this logit) "
                                 "teaches the term only at the signal's second look, under "
                                 "the newest label of its call; the linear weights learn it "
                                 "at once. 0 = off. Ignored without a second look "
                                 "(docs/learning.md, 'The pair term holds')", hot=True,
                                 lo=0.0, hi=100.0)
    wide_doubt_logits: float = _opt(6.0, "a second look whose label is still the gate's "
                                    "own 'allow' (no correction came) while the wide "
                                    "path's pair term says 'block' by more than this logit "
                                    "steps at wide_doubt_weight: about one such 'allow' in "
                                    "four was measured to be a gate mistake nobody "
                                    "corrected (1.2% of all labels). 0 = off "
                                    "(docs/learning.md, 'Doubting an uncorrected allow')",
                                    hot=True, lo=0.0, hi=100.0)
    wide_doubt_weight: float = _opt(0.25, "the weight of a doubted second look (see "
                                    "wide_doubt_logits); 1 = no doubt", hot=True, lo=0.0,
                                    hi=1.0)
    wide_early_block_weight: float = _opt(2.0, "a 'block' label of an ordinary signal "
                                          "(not a correction) weighs this much in the wide "
                                          "path's step and the calibration's fit at the "
                                          "state's first signal, fading to 1 after signal "
                                          "wide_early_block_signals: a young gate blocks "
                                          "more of what it has not seen, and allows less "
                                          "(docs/learning.md, 'Eight seeds with blocks "
                                          "weighing more at first': block recall on "
                                          "unseen values at 178 of 184 checkpoints, was "
                                          "170); 1 = off", hot=True, lo=1.0, hi=100.0)
    wide_early_block_signals: int = _opt(2000, "signals over which "
                                         "wide_early_block_weight fades to 1 (sequence "
                                         "numbers of the signal log); 0 = none", hot=True,
                                         lo=0, hi=1_000_000_000)
    wide_pair_lr: float = _opt(0.1, "AdaGrad learning rate of the wide path's call x history "
                               "pair term (0.1: the sweep in docs/learning.md; larger adds "
                               "noise on the first signals)", hot=True, lo=0.0, hi=100.0)
    wide_pair_first: bool = _opt(True, "the wide path steps its call x history pair term "
                                 "first and its linear weights on what is left, so a history "
                                 "rule is learned by the term that can carry it, not by the "
                                 "outbound call's words (docs/learning.md, 'The pair term "
                                 "first')", hot=True)
    wide_pair_owns_rule_blocks: bool = _opt(True, "a 'block' of a call that can carry data "
                                            "out after a credential-file read (the history "
                                            "rule's shape) is learned by the wide path's "
                                            "pair term alone, not by its linear weights, so "
                                            "the same call after a harmless read is not "
                                            "blocked by its own words (docs/learning.md, "
                                            "'The history rule's blocks are the pair "
                                            "term's')", hot=True)
    wide_turns: bool = _opt(True, "on the CPU, a transformer step stops after each of its "
                            "chunks for the wide path to learn the signals that arrived "
                            "meanwhile and publish them (predictions then wait ~1 s for a "
                            "signal, not a whole step)", hot=True)
    wide_turn_rows: int = _opt(4, "with wide_turns, the step's chunks are at most this many "
                               "rows, so the wide path takes the new signals that often "
                               "(measured: 4 against 8, a third fewer signals per scoring "
                               "and ~40% more transformer steps on 2 cores); 0 = "
                               "step_chunk_rows", hot=True, lo=0, hi=4096)
    wide_residual: bool = _opt(False, "the wide path learns the residual of the serving "
                               "transformer's logit (true: one joint model); false: it "
                               "learns on its own, like a standalone logistic regression, "
                               "and only the transformer learns the residual of the other",
                               hot=True)
    drift_wide_relax: float = _opt(1.0, "after a detected drift the wide path's AdaGrad "
                                   "squared-gradient sums are multiplied by this (0 = its "
                                   "steps as large as at the start; 1 = unchanged, measured "
                                   "better on unseen values)", hot=True, lo=0.0, hi=1.0)
    drift_wide_pair_relax: float = _opt(1.0, "the same for the pair term's sums "
                                        "(train.drift_wide_relax is then the linear "
                                        "weights' alone)", hot=True, lo=0.0, hi=1.0)
    drift_wide_shrink: float = _opt(1.0, "at a drift alarm the wide path's linear weights "
                                    "are multiplied by this (their signs stay; the old "
                                    "policy's confident weights then turn after fewer of "
                                    "the new policy's examples); taken back if the alarm is "
                                    "withdrawn; 1 = unchanged (measured: 0.5 helped in "
                                    "bench_learning; the live daemon's three runs with "
                                    "it lost its change's checkpoint)",
                                    hot=True, lo=0.0, hi=1.0)
    drift_wide_contra_relax: float = _opt(0.1, "after a detected drift, for the next "
                                          "drift_wide_contra_examples examples the wide "
                                          "path learns, one whose label contradicts its "
                                          "logit by more than drift_wide_contra_margin "
                                          "multiplies the AdaGrad sums of its linear "
                                          "buckets by this (each bucket once): what the new "
                                          "policy contradicts turns fast, the rest keeps its "
                                          "steps (measured: 283 -> 240 errors in the 250 "
                                          "signals after a change, eight seeds); 1 = off",
                                          hot=True, lo=0.0, hi=1.0)
    drift_wide_contra_decay: float = _opt(0.0, "in the same window, a label that "
                                          "contradicts the wide path also multiplies by "
                                          "this the linear weights that push against it "
                                          "(by more than 0.3) and that no example of the "
                                          "window has supported yet: the old policy's "
                                          "confident marks that only the flipped calls "
                                          "read; given back if the alarm is withdrawn "
                                          "(measured: the change's checkpoint met on 4 of "
                                          "4 seeds against 3, 102 against 114 errors in "
                                          "the 250 signals after a change; docs/learning.md "
                                          "'Decaying what only the flipped calls read'); "
                                          "1 = off",
                                          hot=True, lo=0.0, hi=1.0)
    drift_wide_contra_decay_votes: int = _opt(2, "how many labels of that window must "
                                              "contradict a weight before "
                                              "drift_wide_contra_decay takes it (a label of "
                                              "the second looks the alarm takes at once, "
                                              "its own evidence, counts as all of them "
                                              "unless more of those looks are for the "
                                              "weight than against it): a "
                                              "policy change contradicts a weight with many "
                                              "calls, the gate's own mistake with one "
                                              "(measured: docs/learning.md 'One wrong label "
                                              "in the window'); 1 = at the first", hot=True,
                                              lo=1, hi=1000)
    drift_wide_contra_examples: int = _opt(500, "the examples after a drift alarm in which "
                                           "drift_wide_contra_relax acts; 0 = off", hot=True,
                                           lo=0, hi=1_000_000)
    drift_wide_contra_margin: float = _opt(0.0, "how far (in logits) the wide path must "
                                           "be on the other side of a label for "
                                           "drift_wide_contra_relax to act on it (0: any "
                                           "contradiction)", hot=True, lo=0.0, hi=100.0)
    drift_wide_unscaled_examples: int = _opt(
        100, "after a drift alarm, until the wide path has learned this many "
        "examples of its drift_wide_contra_examples window, decisions read its byte n-grams "
        "unscaled, not by their familiarity (model.wide_familiarity): the new policy's "
        "first blocks are learned on n-grams the scaling would read less; 0 = always "
        "scaled (docs/learning.md, 'Unscaled while adapting')", hot=True, lo=0, hi=1_000_000)
    drift_look_now: bool = _opt(True, "at a drift alarm the wide path takes at once the "
                                "second looks waiting from the change's estimated start "
                                "(train.wide_second_look would take them that many "
                                "signals later): the new policy's first examples, learned "
                                "again while its contradicted buckets step fast (measured "
                                "in the daemon, six seeds: 190 against 215 errors in the "
                                "250 signals after a change; docs/learning.md 'The new "
                                "policy's second looks at once made the default')",
                                hot=True)
    drift_wide_bag_all: int = _opt(500, "after a detected drift every member of the wide "
                                   "path's bag learns this many examples at least once (a "
                                   "draw of 0 counts as 1), so no member holds the bag's "
                                   "mean on the old policy (measured: 469 -> 436 errors in "
                                   "the 250 signals after a change, 12 seeds); 0 = the "
                                   "draws as always", hot=True, lo=0, hi=1_000_000)
    promotion_holdout_share: float = _opt(0.05, "share of fresh signals held back from "
                                          "training (by call fingerprint) to judge each "
                                          "candidate before it is published; 0 = no "
                                          "promotion gate", lo=0.0, hi=0.5)
    promotion_holdout_after: int = _opt(1000, "fresh signals learned in full before the gate "
                                        "starts holding back, at the start of a state and "
                                        "after a detected policy change: the ones a model "
                                        "learns most from, while the gate has too few to "
                                        "judge anyway (docs/learning.md, 'The promotion "
                                        "gate's warm-up'); 0 = hold back from the first",
                                        lo=0, hi=1_000_000_000)
    promotion_holdout_size: int = _opt(200, "newest held-back signals a candidate is judged "
                                       "on", lo=1, hi=100_000)
    promotion_min_holdout: int = _opt(50, "held-back signals needed before the gate judges "
                                      "at all", lo=1, hi=100_000)
    promotion_margin: float = _opt(0.01, "a candidate is published unless its alignment on "
                                   "the held-back signals is below the serving model's by "
                                   "more than this", hot=True, lo=0.0, hi=1.0)
    promotion_max_refusals: int = _opt(10, "refusals in a row after which training restarts "
                                       "from the serving weights", hot=True, lo=1)
    drift_threshold: float = _opt(12.0, "Page-Hinkley alarm threshold on the progressive "
                                  "error stream; lower = faster, more false alarms",
                                  lo=0.0, lo_open=True)
    drift_delta: float = _opt(0.01, "Page-Hinkley tolerance: error-rate rises below this "
                              "are ignored", lo=0.0)
    drift_adapt_signals: int = _opt(1000, "signals after a detected drift during which EWC "
                                    "is off and replay is reduced", hot=True, lo=0)
    drift_replay_fraction: float = _opt(0.1, "replay share of a batch while adapting to a "
                                        "drift", hot=True, lo=0.0, hi=1.0, hi_open=True)
    drift_confirm_signals: int = _opt(50, "signals a drift alarm waits for corrections "
                                      "before its verdict: the replay labelled before the "
                                      "change is set aside meanwhile, then dropped, or kept "
                                      "when the corrected labels show no rise (a burst of "
                                      "the gate's own mistakes); 0 = drop at the alarm",
                                      hot=True, lo=0, hi=100_000)
    drift_withdraw_below: float = _opt(0.5, "a drift alarm is withdrawn at once only when "
                                       "the test rerun on the corrected labels stays at or "
                                       "under this share of drift_threshold; between it "
                                       "and the threshold the alarm waits "
                                       "drift_confirm_signals again", hot=True, lo=0.0,
                                       hi=1.0)
    drift_confirm_waits: int = _opt(2, "waits of drift_confirm_signals an undecided drift "
                                    "alarm may take in all; at the last the threshold "
                                    "decides", hot=True, lo=1, hi=100)
    allow_band_after: int = _opt(500, "fresh signals progressive validation scores before "
                                 "serving answers `allow` at all (until then a would-be "
                                 "allow is `ask`); 0 = from the first", lo=0)
    allow_band_drift_hold: int = _opt(300, "signals after a detected drift during which a "
                                      "would-be allow is answered `ask`", lo=0)
