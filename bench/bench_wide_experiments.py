"""Wide-path ideas measured in the harness and not kept: each wraps an engine function for
this process only, then runs bench_wide_features.py with the remaining arguments.

Why a wrapper and not a setting: a new `ModelConfig` field changes every state
directory's fingerprint (`ModelConfig.fingerprint` hashes every field), so even an option
left off would make every operator `--reinit`; an idea earns a field when it is kept.
The measurements: docs/learning.md, "A destination key, and holding the linear weights
too (measured 2026-11-25, eighth session; not kept)".

    --experiment destination[:SCALE][:egress]
                               the pair term's call side gains ``p|dest|<domain>``: the
                               last two labels of the mail recipient's domain (``to``) or
                               of the URL's host (``url``), of value SCALE (default 1)
                               before the site's L2 normalisation, so an org-internal
                               POST or mail after a secret read can say "allow" through
                               its own factor; ``:egress``: only on calls that can carry
                               data out (known_names.py `egress_call`)
    --experiment allow-hold=H  a first look's "allow" (weight 1: not a correction) that
                               the wide logit contradicts by more than H is not learned
                               at all until its second look (the pair term's hold,
                               `train.wide_pair_hold`, extended to the linear weights)

    .venv/bin/python bench/bench_wide_experiments.py --experiment destination -- \\
        --seeds 0 1 2 3 4 5 --signals 10000 --switch-at 4000 --every 500 --init-seed -1 \\
        --second-look 200 --pair-hold 3 \\
        --grid 0.3,0.3,1e-3,8,0.1,0.5,1,0.5,0.1,0,-1,1,4,1,1,2,1,0.5,1,1
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_wide_features  # noqa: E402

from gated.engine import tokenizer, wide  # noqa: E402
from gated.engine.known_names import egress_call  # noqa: E402
from gated.engine.wide_learner import WideAdaGrad  # noqa: E402


def destination(context: str) -> str | None:
    """The last two labels of where a call sends to: the ``to`` argument's domain when it
    is a mail address, else the ``url`` argument's host (the stream's two destinations).
    Not the registrable domain (no public-suffix list: ``co.uk`` is one)."""
    _, args = wide._parse_call(context)
    to, url = args.get("to"), args.get("url")
    host = None
    if isinstance(to, str) and "@" in to:
        host = to.rsplit("@", 1)[1]
    elif isinstance(url, str) and (m := wide._URL_AUTHORITY.search(url)):
        host = m.group().rpartition("@")[2].split(":")[0]  # the authority less user, port
    return ".".join(host.lower().split(".")[-2:]) if host else None


def with_destination(pair_features, scale: float = 1.0, egress_only: bool = False):
    """`pair_features` with the destination key on the call side, of raw value `scale`
    (`egress_only`: only on calls that can carry data out, known_names.egress_call)."""
    def features(context, history, buckets, sensitive_scale=0.0, egress_scale=0.0):
        c_idx, c_val, h_idx, h_val, h_grp = pair_features(context, history, buckets,
                                                           sensitive_scale, egress_scale)
        dest = destination(context)
        if dest is None or (egress_only and not egress_call(*wide._parse_call(context))):
            return c_idx, c_val, h_idx, h_val, h_grp
        raw = np.r_[c_val / c_val[0], scale]  # the site's raw values: its tool key is 1.0
        return (np.r_[c_idx, wide._bucket("p|dest|" + dest, buckets)],
                raw / np.linalg.norm(raw), h_idx, h_val, h_grp)
    return features


def with_allow_hold(learn, threshold: float, held: list[int]):
    """`WideAdaGrad.learn` that skips a contradicted first-look "allow" (counted in
    `held`); the harness passes `pair_hold` > 0 on first looks only."""
    def hold_or_learn(self, idx, val, z_rest, label, weight, pair=None, pair_hold=0.0):
        if pair_hold > 0 and label >= 0.5 and weight <= 1.0:
            z = self._gradient(idx, val, z_rest, label, weight, pair)["z"]
            if z < -threshold:
                held[0] += 1
                return z
        return learn(self, idx, val, z_rest, label, weight, pair, pair_hold)
    return hold_or_learn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", required=True, action="append",
                    help="destination[:SCALE][:egress], or allow-hold=H (repeatable)")
    ap.add_argument("rest", nargs=argparse.REMAINDER,
                    help="-- then bench_wide_features.py's arguments")
    a = ap.parse_args()
    held = [0]
    for exp in a.experiment:
        if exp.startswith("destination"):  # destination[:SCALE][:egress]
            opts = exp.split(":")[1:]
            scale = next((float(o) for o in opts if o != "egress"), 1.0)
            tokenizer.pair_features = with_destination(tokenizer.pair_features, scale,
                                                       "egress" in opts)
        elif exp.startswith("allow-hold="):
            WideAdaGrad.learn = with_allow_hold(WideAdaGrad.learn,
                                                float(exp.split("=", 1)[1]), held)
        else:
            ap.error(f"unknown experiment {exp!r}: destination[:SCALE][:egress] or "
                     "allow-hold=H")
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    pair_hold = float(rest[rest.index("--pair-hold") + 1]) if "--pair-hold" in rest else 0.0
    if any(e.startswith("allow-hold=") for e in a.experiment) and pair_hold <= 0:
        ap.error("allow-hold holds first looks only, which the harness marks by its pair "
                 "hold: pass --pair-hold H (> 0) too")
    print(f"experiments: {', '.join(a.experiment)}", flush=True)
    sys.argv = [sys.argv[0], *rest]
    bench_wide_features.main()
    if held[0]:
        print(f"first-look allows held from the linear weights: {held[0]}")


if __name__ == "__main__":
    main()
