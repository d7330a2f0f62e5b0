"""A CPU step's chunks on several cores at once (daemon/trainer/cores.py ChunkCores and
Model.loss_parts_and_grads with `cores`): real threads, real BLAS, float64 sums."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest
from test_engine_model import _random_model

from gated.config import TrainConfig
from gated.daemon.trainer import build_trainer
from gated.daemon.trainer.cores import ChunkCores
from gated.engine import EWC, AdamW, Model, ModelConfig, build_batch, train_step
from gated.store import Store


def _examples(n: int) -> list[dict]:
    """`n` examples of many source lengths, some without a reason or history."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        arg = "x" * int(rng.integers(1, 20))
        out.append({"context": f"shell.exec rm -rf /{arg}" if i % 3 == 0 else f"fs.read {arg}",
                    "history": [f"fs.read a{j}" for j in range(i % 4)] or None,
                    "reason": None if i % 4 == 3 else f"why {arg}",
                    "label": float(i % 3 != 0), "weight": float(1 + i % 3)})
    return out


@pytest.fixture
def cores():
    c = ChunkCores(2)
    yield c
    c.close()


@pytest.mark.parametrize("width", [2, 3])
def test_chunks_on_cores_give_the_serial_loss_and_gradient(width):
    """The chunks in rounds on `width` cores: the same loss parts and gradient as one at a
    time (float64; only the order of the sums differs), EWC's term counted once, and the
    gradient overwritten, not added to the last step's."""
    cfg = ModelConfig.tiny()
    model = _random_model(3, cfg)
    model.ewc = EWC(model.num_params, lam=0.3, xp=np, dtype="float64")
    model.ewc.consolidate(model.flat + 0.01)
    batch = build_batch(_examples(11), cfg)  # 11 rows in chunks of 2: a short last round
    serial_loss, serial_parts = model.loss_parts_and_grads(batch, chunk_rows=2)
    serial = model.grad_flat.copy()
    runner = ChunkCores(width)
    try:
        for _ in range(2):  # the second time over the twins' gradients of the first
            model.grad_flat[...] = 123.0
            for twin in model.twins(width - 1):
                twin.grad_flat[...] = -7.0
            loss, parts = model.loss_parts_and_grads(batch, chunk_rows=2, cores=runner)
            assert np.isclose(loss, serial_loss, rtol=1e-12)
            assert parts.keys() == serial_parts.keys() and "ewc" in parts
            for k in parts:
                assert np.isclose(parts[k], serial_parts[k], rtol=1e-12), k
            np.testing.assert_allclose(model.grad_flat, serial, rtol=1e-10, atol=1e-14)
    finally:
        runner.close()


def test_the_twins_share_the_weights_and_follow_a_new_buffer(cores):
    cfg = ModelConfig.tiny()
    model = Model.init(cfg, seed=1, dtype="float64")
    (twin,) = model.twins(1)
    assert twin.flat is model.flat and twin.grad_flat is not model.grad_flat
    assert model.twins(1)[0] is twin  # kept across steps
    model.flat = model.flat.copy()  # e.g. weights installed anew
    (fresh,) = model.twins(1)
    assert fresh is not twin and fresh.flat is model.flat


def test_between_chunks_runs_once_a_round_with_no_chunk_running(cores):
    """The wide path's turn may change weights the chunks read: it comes between rounds."""
    cfg = ModelConfig.tiny()
    model = Model.init(cfg, seed=1, dtype="float64")
    running = []
    forward = Model._forward

    def watched(self, *a, **kw):
        running.append(1)
        try:
            return forward(self, *a, **kw)
        finally:
            running.pop()
    seen = []
    Model._forward = watched
    try:
        model.loss_parts_and_grads(build_batch(_examples(8), cfg), chunk_rows=2,
                                   between_chunks=lambda: seen.append(len(running)),
                                   cores=cores)
    finally:
        Model._forward = forward
    assert seen == [0, 0]  # 4 chunks, 2 rounds


def test_train_steps_on_cores_follow_the_serial_ones():
    """Whole train_steps (clip, AdamW) with and without cores stay together (float64)."""
    cfg = ModelConfig.tiny()
    batch = build_batch(_examples(9), cfg)
    a = _random_model(4, cfg)
    b = Model.from_flat(cfg, a.flat, dtype="float64")
    opt_a, opt_b = (AdamW.for_model(m, lr=1e-3, clip_norm=1.0) for m in (a, b))
    runner = ChunkCores(2)
    try:
        for _ in range(3):
            ia = train_step(a, opt_a, batch, chunk_rows=3)
            ib = train_step(b, opt_b, batch, chunk_rows=3, cores=runner)
            assert ia["finite"] == ib["finite"] == 1.0
            assert np.isclose(ia["grad_norm"], ib["grad_norm"], rtol=1e-10)
    finally:
        runner.close()
    np.testing.assert_allclose(a.flat, b.flat, rtol=1e-9, atol=1e-12)


def test_run_keeps_the_order_and_limits_blas_to_one_thread(cores):
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    before = blas_threads()
    out = cores.run([lambda: ("first", blas_threads()), lambda: ("second", blas_threads())])
    assert [name for name, _ in out] == ["first", "second"]
    assert before and all(threads == [1] * len(before) for _, threads in out)
    assert blas_threads() == before  # put back after the round
    assert cores.run([]) == []
    with pytest.raises(ValueError, match="3 jobs for 2 cores"):
        cores.run([int, int, int])


def test_a_failed_job_is_raised_after_the_others_finished(cores):
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.2)
        finished.set()

    def fail() -> None:
        raise FloatingPointError("chunk failed")
    with pytest.raises(FloatingPointError, match="chunk failed"):
        cores.run([fail, slow])
    assert finished.is_set()


def test_chunk_cores_needs_two():
    with pytest.raises(ValueError, match="at least 2"):
        ChunkCores(1)


@pytest.mark.parametrize(("step_cores", "threads", "expected"),
                         [(0, 1, None), (0, 2, 2), (3, 1, 3), (1, 4, None)])
def test_the_trainer_takes_its_cores_from_the_settings_or_its_threads(
        tmp_path, step_cores, threads, expected):
    store = Store(tmp_path / "state")
    settings = dataclasses.replace(TrainConfig(), step_cores=step_cores, batch_size=8,
                                   step_chunk_rows=2, promotion_holdout_share=0.0)
    trainer, _ = build_trainer(store, ModelConfig.tiny(), settings, seed=0)
    trainer.use_cores(threads)
    assert (trainer.cores.width if trainer.cores else None) == expected
    if trainer.cores is not None:  # a real step on them, with turns between the rounds
        store.append_signals([{"context": f"fs.read src/{i}.py", "decision": "allow"}
                              for i in range(8)])
        trainer.train_on(store.read_signals(0, 8), turns=True)
        assert trainer.status.step == 1 and np.all(np.isfinite(trainer.model.flat))
        trainer.cores.close()
    store.close()


def test_a_daemon_whose_trainer_has_two_threads_steps_on_two_cores(tmp_path):
    """The wiring end to end: a real `gated run` with `daemon.trainer_threads = 2` gives its
    trainer process the cores (its log says so) and trains every signal sent."""
    from daemon_proc import FAST, start, wait_until

    from gated.synthetic import SyntheticGateway

    cfg = tmp_path / "gated.toml"
    cfg.write_text("[daemon]\ntrainer_threads = 2\n" + FAST + "step_chunk_rows = 4\n")
    d = start(tmp_path, config=cfg)
    try:
        with d.client() as c:
            gen = SyntheticGateway(seed=3)
            c.signals([gen.signal() for _ in range(96)])
            wait_until(lambda: (s := c.status())["last_trained_seq"] == 96
                       and s["step"] >= 2, timeout=120,
                       what="the 96 signals scored and two steps taken")
        assert "a training step's chunks run 2 at a time" in d.log()
    finally:
        assert d.stop() == 0


def test_the_limit_holds_in_a_fresh_process_that_has_not_loaded_numpy():
    """threadpoolctl limits only loaded libraries: the trainer process calls the limit
    before it imports the engine, and until 2026-11-29 that left its OpenBLAS at a thread
    per core (bench/bench_live.py: the trainer at ~1.5 of 2 cores). A fresh interpreter,
    as a spawned trainer is, must come out at the limit."""
    import ast
    import os
    import subprocess
    import sys

    code = ("from gated.daemon.blas import limit_blas_threads; print(limit_blas_threads(1)); "
            "from threadpoolctl import threadpool_info; "
            "print([p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas'])")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    reported, seen = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                    text=True, check=True, env=env).stdout.split("\n")[:2]
    assert reported == seen
    assert ast.literal_eval(seen) and set(ast.literal_eval(seen)) == {1}


def test_a_daemons_trainer_process_runs_blas_at_its_share_of_the_cores(tmp_path):
    """A real `gated run` whose trainer gets one thread: its log reports the BLAS pools it
    has after the limit (threadpool_info in the trainer process itself)."""
    from daemon_proc import FAST, start

    cfg = tmp_path / "gated.toml"
    cfg.write_text("[daemon]\ntrainer_threads = 1\n" + FAST)
    d = start(tmp_path, config=cfg)
    try:
        with d.client() as c:
            c.ping()
        wait_for = time.monotonic() + 60
        while "trainer process: BLAS at" not in d.log() and time.monotonic() < wait_for:
            time.sleep(0.1)
        assert "trainer process: BLAS at [1] thread(s)" in d.log()
    finally:
        assert d.stop() == 0
