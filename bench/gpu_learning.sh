#!/usr/bin/env bash
# Issue 10's GPU learning runs in ONE device-tool call (after bench/gpu_session.sh's setup:
# lmdb and watchdog as wheels in .whl/). Run from the repository root THERE:
#
#   device: run(command="bash bench/gpu_learning.sh", carry=[".whl"], timeout_s=560)
#
# 0. The parity tests of the engine on the device (NumPy vs CuPy, ~1 min, capped at 90 s).
# 1. The first checkpoint (lost on fresh GPU machines on 2026-11-25 and -26 until the trainer
#    rehearsed its path before the clock: CuPy compiled its kernels during the first signals;
#    docs/learning.md "The first seconds on a GPU"). Four runs side by side, 1,000 signals
#    each, every scored signal traced (`--trace`): seeds 0 and 2; seed 0 with lr 0 (the
#    transformer never moves: the wide path alone, on the GPU); seed 0 on this machine's
#    CPU (NumPy: the control).
# 2. The whole picture: seeds 0, 1, 2 side by side, 4,500 signals, the policy change at
#    2,000 (shorter than the 5,500 of 2026-11-25 to fit one call beside steps 0 and 1).
#
# Each run writes its own table to $OUT; the traces, the parity log and the machine's
# details go back in one archive, extras.tgz (runs in parallel cannot all rewrite
# docs/benchmarks.md; copy the tables there by hand, with the machine and this command).
# GATED_COLD=1 gives each long run its own empty CuPy kernel cache (a fresh machine's).
# GATED_BACKEND=numpy GATED_SIGNALS=300 GATED_LONG_SIGNALS=300 runs it on a CPU (dry run).
#
# The CPU benchmark's protocol on the GPU (2026-11-27): GATED_SHORT=0 skips step 1,
# GATED_SEEDS="0 1 2 3" GATED_LONG_SIGNALS=8000 GATED_SWITCH_AT=4000 GATED_PROBES=1000
# GATED_LONG_TIMEOUT=450 GATED_PARITY_LAST=1 (the parity tests after the runs, so that
# their GPU work cannot stall the runs' first checkpoint).
#
# A run its timeout cuts short ends on SIGTERM with its last checkpoint and its summary
# (bench_learning.py, since 2026-11-28); allow ~30 s for that after GATED_LONG_TIMEOUT.
# What fits (2026-11-28, H200, 8d29e6b): four runs side by side reached ~6,500 signals in
# 440 s (the probes at each checkpoint run off the virtual clock and slow under contention),
# and each trainer took ~1.8 transformer steps/s where one run alone took 5.0.
set -uo pipefail
OUT=${OUT:-/tmp/gated-gpu}
BACKEND=${GATED_BACKEND:-cupy}
SHORT=${GATED_SHORT:-${GATED_SIGNALS:-1000}}
LONG=${GATED_LONG_SIGNALS:-4500}
SWITCH=${GATED_SWITCH_AT:-$((LONG * 4 / 9))}
SEEDS=${GATED_SEEDS:-0 1 2}
PROBES=${GATED_PROBES:-400}
LONG_TIMEOUT=${GATED_LONG_TIMEOUT:-250}
PARITY_LAST=${GATED_PARITY_LAST:-0}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=3
PY=${PYTHON:-python3}
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
date -u +%T > "$OUT/times.txt"

parity() {
    if [ "$BACKEND" = cupy ]; then
        timeout 90 "$PY" -m pytest -q -x -p no:cacheprovider tests/test_kernels.py \
            > "$OUT/parity.log" 2>&1
        tail -3 "$OUT/parity.log"
    fi
    date -u +%T >> "$OUT/times.txt"
}
[ "$PARITY_LAST" = 1 ] || parity

short() {  # name, then bench_learning arguments
    local name=$1; shift
    timeout 170 "$PY" bench/bench_learning.py --signals "$SHORT" --switch-at "$SHORT" \
        --probes 200 --trace "$OUT/trace-$name.jsonl" "$@" > "$OUT/first-$name.txt" 2>&1
}
if [ "$SHORT" != 0 ]; then
    short seed0 --backend "$BACKEND" --seed 0 &
    short seed2 --backend "$BACKEND" --seed 2 &
    short seed0-lr0 --backend "$BACKEND" --seed 0 --lr 0 &
    short seed0-cpu --backend numpy --seed 0 &
    wait
    for f in "$OUT"/first-*.txt; do echo "$f"; grep -h -E "^\| [0-9]" "$f" | cut -c1-150; done
    date -u +%T >> "$OUT/times.txt"
fi

for s in $SEEDS; do
    # GATED_COLD=1: each run with its own empty CuPy kernel cache, as on a fresh machine
    # (runs side by side otherwise share what the first one compiles)
    [ "${GATED_COLD:-0}" = 1 ] && export CUPY_CACHE_DIR="/tmp/cupy-cache-$s" && \
        rm -rf "$CUPY_CACHE_DIR"
    timeout -k 60 "$LONG_TIMEOUT" "$PY" bench/bench_learning.py --backend "$BACKEND" \
        --signals "$LONG" --switch-at "$SWITCH" --probes "$PROBES" --seed "$s" \
        --trace "$OUT/trace-long-seed$s.jsonl" > "$OUT/long-seed$s.txt" 2>&1 &
done
wait
grep -h -E "^- (gated ahead|first checkpoint|back to|over all)" "$OUT"/long-seed*.txt
date -u +%T >> "$OUT/times.txt"
[ "$PARITY_LAST" = 1 ] && parity
# at most 8 files come back from a call: the 7 tables, and everything else in one archive
(cd "$OUT" && tar czf extras.tgz trace-*.jsonl parity.log nvidia-smi.txt commit.txt times.txt \
    2>/dev/null; rm -f trace-*.jsonl parity.log nvidia-smi.txt commit.txt times.txt)
