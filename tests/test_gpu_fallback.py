"""GPU start-up checks and the GPU -> CPU fallback, tested on a machine without a GPU.

The memory estimate is pure arithmetic and is tested as such. Everything else runs
against the stand-ins of tests/gpu_standin.py: a NumPy backend that calls itself "cupy"
and raises on purpose, a fake CUDA runtime reporting the memory we choose, fake kernels.
They stand in for a GPU that cannot exist on CI: these tests show what the daemon does
when the GPU backend fails, not that a real GPU fails that way.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from daemon_proc import FAST, metric_samples, metric_value, start, wait_until
from gpu_standin import FakeKernels, FakeRuntime, StandInCudaError, StandInGpuOps, install

import gated.device as device
from gated.config import TrainConfig
from gated.daemon.trainer import GPU_FAILURES_BEFORE_CPU, TrainerEvents, build_trainer
from gated.engine import ModelConfig, param_layout
from gated.engine.layout import num_params
from gated.engine.ops_numpy import NumpyOps
from gated.store import Store, StoreError

GiB = 1 << 30
STANDIN_DAEMON = [sys.executable, str(Path(__file__).with_name("gpu_standin_daemon.py"))]


# --- memory estimate ----------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny", "flint"])
def test_estimate_parameter_buffers_are_exact(preset):
    cfg = ModelConfig.preset(preset)
    p = num_params(param_layout(cfg))
    parts = device.training_memory_breakdown(cfg, 16, cfg.max_seq_len, cfg.max_seq_len)
    assert parts["params"] + parts["grads"] + parts["adam_m"] + parts["adam_v"] == 4 * p * 4
    assert parts["decay_mask"] == p * 4 and parts["ewc"] == 2 * p * 4
    assert parts["serving"] == 2 * (2 * p + cfg.max_seq_len * cfg.d_model) * 4
    assert device.estimate_training_bytes(cfg, 16, cfg.max_seq_len, cfg.max_seq_len) == \
        sum(parts.values())
    # float64 doubles every float buffer
    parts64 = device.training_memory_breakdown(cfg, 16, 32, 32, dtype_bytes=8)
    assert parts64["params"] == 2 * parts["params"]


def test_estimate_grows_linearly_with_batch_and_faster_with_length():
    cfg = ModelConfig.flint()
    batches = (1, 2, 4, 8, 16, 32)
    est = [device.estimate_training_bytes(cfg, b, 256, 256) for b in batches]
    per_example = est[1] - est[0]
    assert per_example > 0
    for b, e in zip(batches, est, strict=True):  # exactly affine in the batch size
        assert e == est[0] + (b - 1) * per_example
    # attention probabilities are quadratic in the length: doubling it more than doubles
    # the per-example part
    short = device.estimate_training_bytes(cfg, 2, 128, 128) - \
        device.estimate_training_bytes(cfg, 1, 128, 128)
    assert per_example > 2 * short
    # the default flint config needs about a GiB, not a MiB and not a hundred GiB
    assert 0.5 * GiB < device.estimate_training_bytes(cfg, 16, 256, 256) < 4 * GiB


def test_estimate_counts_attention_probabilities_and_logits():
    cfg = ModelConfig.flint()
    b, s, t = 4, 200, 50
    parts = device.training_memory_breakdown(cfg, b, s, t)
    probs = (cfg.n_enc_layers * b * cfg.n_heads * s * s
             + cfg.n_dec_layers * b * cfg.n_heads * (t * t + t * s))
    assert parts["activations"] > probs * 4
    assert parts["logits"] == 2 * b * t * cfg.vocab_size * 4
    assert parts["transient"] == 2 * b * cfg.n_heads * s * s * 4  # the largest: [B,H,S,S]
    with pytest.raises(ValueError):
        device.estimate_training_bytes(cfg, 0, 10, 10)


# --- preflight -----------------------------------------------------------------------------


def test_preflight_reports_device_memory_and_compiles_kernels():
    cfg, train = ModelConfig.flint(), TrainConfig()
    rt = FakeRuntime(free=70 * GiB, total=80 * GiB)
    info = device.gpu_preflight(cfg, train, runtime=rt, ops_factory=FakeKernels)
    assert info["device_name"] == "Stand-in GPU 80GB"
    assert info["total_bytes"] == 80 * GiB and info["free_bytes"] == 70 * GiB
    assert info["estimate_bytes"] == device.estimate_training_bytes(
        cfg, train.batch_size, cfg.max_seq_len, cfg.max_seq_len)
    assert info["kernels"] == 13 and info["compile_seconds"] >= 0
    line = device.describe_preflight(info)
    assert "Stand-in GPU 80GB" in line and "80.00 GiB total" in line and "13 kernels" in line
    assert "accelerators" not in line  # stand-in kernels: no CuPy loaded, nothing to say
    # on a real GPU the preflight records CuPy's reduction accelerators (ops_cupy), and the
    # log line says which, or none (gated's default: docs/operations.md)
    assert device.describe_preflight({**info, "reduction_accelerators": []}).endswith(
        "; CuPy reduction accelerators: none")
    assert device.describe_preflight({**info, "reduction_accelerators": ["cub"]}).endswith(
        "; CuPy reduction accelerators: cub")


def test_preflight_refuses_a_config_that_does_not_fit_before_compiling():
    cfg = ModelConfig.flint()
    train = dataclasses.replace(TrainConfig(), batch_size=4096)
    rt = FakeRuntime(free=3 * GiB, total=8 * GiB)
    before = FakeKernels.calls
    with pytest.raises(device.PreflightError) as err:
        device.gpu_preflight(cfg, train, runtime=rt, ops_factory=FakeKernels)
    msg = str(err.value)
    need = device.estimate_training_bytes(cfg, 4096, 256, 256)
    assert f"{need / GiB:.2f} GiB" in msg and "3.00 GiB free of 8.00 GiB" in msg
    assert "batch_size" in msg and 'device = "cpu"' in msg and "preset" in msg
    assert FakeKernels.calls == before  # no compile for a config that cannot run


def _gpu_present(monkeypatch):
    monkeypatch.setattr(device, "select_backend",
                        lambda dev: ("cupy", "cuda:0 Stand-in GPU", f"device={dev}: 1 CUDA "
                                     "device(s)"))


def test_choose_backend_auto_falls_back_to_the_cpu_when_the_preflight_fails(monkeypatch):
    _gpu_present(monkeypatch)
    cfg, train = ModelConfig.flint(), dataclasses.replace(TrainConfig(), batch_size=4096)

    def small_gpu(m, t):
        return device.gpu_preflight(m, t, runtime=FakeRuntime(GiB, 2 * GiB),
                                    ops_factory=FakeKernels)

    choice = device.choose_backend("auto", cfg, train, preflight=small_gpu)
    assert (choice.backend, choice.device, choice.fell_back) == ("numpy", "cpu", True)
    assert "device=auto: the GPU preflight failed: this configuration needs" in choice.reason
    assert choice.reason.endswith("using the CPU")

    def broken_compiler(m, t):
        return device.gpu_preflight(m, t, runtime=FakeRuntime(70 * GiB, 80 * GiB),
                                    ops_factory=lambda: FakeKernels(
                                        RuntimeError("nvrtc: error: invalid option")))

    choice = device.choose_backend("auto", cfg, TrainConfig(), preflight=broken_compiler)
    assert choice.backend == "numpy" and "RuntimeError: nvrtc: error" in choice.reason
    with pytest.raises(RuntimeError, match="device=cuda: the GPU preflight failed: this "
                                           "configuration needs"):
        device.choose_backend("cuda", cfg, train, preflight=small_gpu)


def test_choose_backend_uses_the_gpu_when_the_preflight_passes(monkeypatch):
    _gpu_present(monkeypatch)

    def big_gpu(m, t):
        return device.gpu_preflight(m, t, runtime=FakeRuntime(70 * GiB, 80 * GiB),
                                    ops_factory=FakeKernels)

    choice = device.choose_backend("auto", ModelConfig.flint(), TrainConfig(),
                                   preflight=big_gpu)
    assert (choice.backend, choice.fell_back) == ("cupy", False)
    assert choice.preflight["kernels"] == 13


def test_choose_backend_cpu_never_runs_the_preflight():
    def boom(m, t):
        raise AssertionError("preflight ran for device=cpu")

    choice = device.choose_backend("cpu", ModelConfig.tiny(), TrainConfig(), preflight=boom)
    assert (choice.backend, choice.device, choice.fell_back) == ("numpy", "cpu", False)


# --- run-time fallback in the trainer -------------------------------------------------------


class Recorder(TrainerEvents):
    def __init__(self) -> None:
        self.rollbacks: list[str] = []
        self.fallbacks: list[str] = []
        self.swaps: list[int] = []

    def on_rollback(self, reason: str) -> None:
        self.rollbacks.append(reason)

    def on_gpu_fallback(self, reason: str) -> None:
        self.fallbacks.append(reason)

    def on_swap(self, version: int) -> None:
        self.swaps.append(version)


def _sig(i: int, decision: str = "allow") -> dict:
    return {"context": f"bash ls /tmp/{i}", "decision": decision}


def _gpu_trainer(tmp_path, monkeypatch, factory=StandInGpuOps, **settings):
    made = install(monkeypatch.setattr, factory)
    store = Store(tmp_path / "state")
    events = Recorder()
    cfg = dataclasses.replace(TrainConfig(), lr=3e-3, swap_every_steps=2,
                              swap_every_seconds=3600.0, **settings)
    trainer, serving = build_trainer(store, ModelConfig.tiny(), cfg, seed=0, backend="cupy",
                                     events=events)
    return store, trainer, serving, events, made


def _train(store, trainer, n: int, start: int = 0) -> None:
    store.append_signals([_sig(start + i, "allow" if i % 3 else "block") for i in range(n)])
    while trainer.status.last_trained_seq < store.last_seq():
        trainer.train_on(store.read_signals(trainer.status.last_trained_seq, 8))


def test_gpu_step_failures_roll_back_then_switch_to_the_cpu_and_keep_training(
        tmp_path, monkeypatch, caplog):
    """Three failed steps on the (stand-in) GPU in a row: each is rolled back to the last
    good state and counted; the third moves training and serving to the CPU with the
    weights and optimiser state of that good state, and training goes on there."""
    store, trainer, serving, events, made = _gpu_trainer(tmp_path, monkeypatch)
    gpu_ops = trainer.model.ops
    assert isinstance(gpu_ops, StandInGpuOps) and trainer.on_gpu
    assert isinstance(serving.current.model.ops, StandInGpuOps) and serving.backend == "cupy"
    _train(store, trainer, 24)
    trainer._maybe_swap(force=True)
    good_version, good_flat = store.load_published()
    good_m, good_v, good_t = trainer.opt.m.copy(), trainer.opt.v.copy(), trainer.opt.t
    step0, served = trainer.status.step, serving.current
    np.testing.assert_array_equal(trainer.model.flat, good_flat)

    calls = gpu_ops.adamw_calls
    gpu_ops.fail_adamw = {calls + 1, calls + 2, calls + 3}
    for k in range(1, GPU_FAILURES_BEFORE_CPU + 1):
        store.append_signals([_sig(1000 + k)])
        trainer.train_on(store.read_signals(trainer.status.last_trained_seq, 8))
        assert trainer.status.rollbacks == k
        # rolled back: the half-written update is gone
        np.testing.assert_array_equal(trainer.model.ops.to_numpy(trainer.model.flat),
                                      good_flat)
        np.testing.assert_array_equal(trainer.model.ops.to_numpy(trainer.opt.m), good_m)
        assert trainer.opt.t == good_t and trainer.status.step == step0
        if k < GPU_FAILURES_BEFORE_CPU:
            assert trainer.on_gpu and trainer.model.ops is gpu_ops and not events.fallbacks
    assert len(events.rollbacks) == 3 and all("StandInCudaError" in r for r in events.rollbacks)

    # switched: a NumPy model and AdamW, holding exactly the last good state
    assert not trainer.on_gpu
    assert type(trainer.model.ops) is NumpyOps and type(trainer.opt.ops) is NumpyOps
    assert isinstance(trainer.model.flat, np.ndarray) and trainer.model.flat.dtype == np.float32
    np.testing.assert_array_equal(trainer.model.flat, good_flat)
    np.testing.assert_array_equal(trainer.opt.m, good_m)
    np.testing.assert_array_equal(trainer.opt.v, good_v)
    assert trainer.opt.t == good_t and trainer.opt.lr == 3e-3
    assert trainer.model.ewc.fisher.shape == good_flat.shape
    # serving moved too: same version, same weights, on NumPy
    assert serving.backend == "numpy" and type(serving.current.model.ops) is NumpyOps
    assert serving.current is not served and serving.current.version == good_version
    np.testing.assert_array_equal(serving.current.model.flat, good_flat)
    assert len(events.fallbacks) == 1 and "cudaErrorLaunchFailure" in events.fallbacks[0]
    line = [r for r in caplog.records if "switched to the CPU" in r.getMessage()]
    assert line and line[0].levelname == "ERROR"
    assert "GPU training failed 3 times in a row (last error: StandInCudaError" in \
        line[0].getMessage()
    assert "check the GPU (nvidia-smi) and restart" in line[0].getMessage()

    # training goes on, on the CPU, and publishes new versions
    before = trainer.model.flat.copy()
    _train(store, trainer, 24, start=2000)
    trainer._maybe_swap(force=True)
    assert trainer.status.step > step0 and not np.array_equal(trainer.model.flat, before)
    assert trainer.status.version > good_version and events.swaps[-1] == trainer.status.version
    assert type(serving.current.model.ops) is NumpyOps
    assert serving.current.version == trainer.status.version
    np.testing.assert_array_equal(store.load_published()[1], serving.current.model.flat)
    assert len(events.fallbacks) == 1 and gpu_ops.adamw_calls == calls + 3  # GPU left alone
    store.close()


def test_failures_must_be_consecutive(tmp_path, monkeypatch):
    store, trainer, _, events, _ = _gpu_trainer(tmp_path, monkeypatch)
    ops = trainer.model.ops
    ops.fail_adamw = {1, 2, 4, 5, 7, 8}  # two fail, one succeeds, ...
    _train(store, trainer, 8 * 9)
    assert trainer.status.rollbacks == 6 and trainer.on_gpu and not events.fallbacks
    assert trainer.status.step == ops.adamw_calls - 6
    store.close()


def test_cpu_exceptions_still_surface(tmp_path):
    """On the CPU backend an exception in a step is a bug: it is raised, not rolled back."""
    store = Store(tmp_path / "state")
    trainer, _ = build_trainer(store, ModelConfig.tiny(), TrainConfig(), seed=0)

    def broken(*a, **kw):
        raise ValueError("a bug in the CPU path")

    trainer.model.ops.adamw = broken
    store.append_signals([_sig(1)])
    with pytest.raises(ValueError, match="a bug in the CPU path"):
        trainer.train_on(store.read_signals(0, 8))
    assert trainer.status.rollbacks == 0
    store.close()


def test_store_errors_are_not_gpu_failures(tmp_path, monkeypatch):
    store, trainer, _, _, _ = _gpu_trainer(tmp_path, monkeypatch)
    assert trainer._gpu_error(StoreError("map full"), "a test") is False
    assert trainer._gpu_error(StandInCudaError("x"), "a test") is True
    assert trainer.status.rollbacks == 1 and trainer.on_gpu
    store.close()


def test_a_gpu_that_cannot_even_roll_back_switches_at_once(tmp_path, monkeypatch):
    """When restoring the good state on the device fails too (a dead context), the trainer
    does not retry on the GPU; the serving weights come from the store when the device
    cannot give them back."""
    store, trainer, serving, events, made = _gpu_trainer(tmp_path, monkeypatch)
    _train(store, trainer, 16)
    trainer._maybe_swap(force=True)
    version, good = store.load_published()
    for ops in made:
        ops.dead = True  # nothing can be read back from the device any more

    def rollback_fails(why):
        raise StandInCudaError("cudaErrorLaunchFailure while restoring")

    monkeypatch.setattr(trainer, "_rollback", rollback_fails)
    assert trainer._gpu_error(StandInCudaError("cudaErrorIllegalAddress"), "a training step")
    assert not trainer.on_gpu and len(events.fallbacks) == 1
    assert "restoring on the GPU then failed" in events.fallbacks[0]
    np.testing.assert_array_equal(trainer.model.flat, good)
    assert serving.current.version == version and type(serving.current.model.ops) is NumpyOps
    np.testing.assert_array_equal(serving.current.model.flat, good)
    _train(store, trainer, 16, start=600)  # and it trains on
    assert trainer.status.step > 0
    store.close()


def test_serving_failures_in_the_trainer_thread_fall_back_instead_of_crashing(tmp_path,
                                                                               monkeypatch):
    """A GPU error outside a step (scoring fresh signals on the serving snapshot) in the
    running trainer thread: counted the same way, and the thread lives on, on the CPU."""
    store, trainer, serving, events, made = _gpu_trainer(tmp_path, monkeypatch,
                                                         idle_steps_per_second=0.0)
    serving.current.model.ops.fail_gate = 3
    store.append_signals([_sig(i) for i in range(40)])
    trainer.start()
    try:
        deadline = time.monotonic() + 30
        # taking the 40 signals and stepping on them are two moments: wait for both
        while time.monotonic() < deadline and (trainer.status.last_trained_seq < 40
                                               or not events.fallbacks
                                               or trainer.status.step == 0):
            trainer.wake()
            time.sleep(0.05)
        assert trainer.is_alive()
        assert len(events.fallbacks) == 1 and "cudaErrorIllegalAddress" in events.fallbacks[0]
        assert trainer.status.last_trained_seq == 40 and trainer.status.step > 0
        assert not trainer.on_gpu and serving.backend == "numpy"
        assert trainer.window.total_scored == 40  # nothing scored twice
    finally:
        trainer.stop(drain=False)
        trainer.join(timeout=30)
    assert not trainer.is_alive()
    store.close()


# --- end to end: a real `gated run` on the stand-in GPU, a real socket, a real scrape --------


def _signals(n: int, start: int = 0) -> list[dict]:
    return [{"context": f"bash cat notes/{start + i}.txt", "decision": "allow" if i % 4
             else "block"} for i in range(n)]


def test_daemon_switches_to_the_cpu_after_repeated_gpu_failures(tmp_path):
    config = tmp_path / "gated.toml"
    config.write_text(FAST)
    d = start(tmp_path, config=config, extra=["--device", "auto"], launcher=STANDIN_DAEMON,
              env={"GATED_STANDIN_FAIL_ADAMW": "4,5,6"})
    try:
        with d.client() as c:
            st = c.status()
            assert (st["backend"], st["device"]) == ("cupy", "cuda:0 Stand-in GPU")
            got = metric_samples(d.scrape())
            assert metric_value(got, "gated_backend_info", backend="cupy") == 1
            assert metric_value(got, "gated_device_memory_bytes", kind="total") == 80 * GiB
            assert metric_value(got, "gated_device_memory_bytes", kind="free") == 70 * GiB
            assert metric_value(got, "gated_device_memory_bytes", kind="estimate") == \
                device.estimate_training_bytes(ModelConfig.tiny(), 16, 32, 32)
            assert metric_value(got, "gated_gpu_fallbacks_total") == 0
            # the trainer process rehearsed its path on the (stand-in) GPU first
            wait_until(lambda: "trainer rehearsal on the GPU:" in d.log(),
                       what="the trainer's rehearsal")
            c.signals(_signals(200))
            st = wait_until(lambda: (s := c.status())["backend"] == "numpy" and s,
                            what="the switch to the CPU")
            assert st["device"] == "cpu" and st["rollbacks"] >= 3
            got = metric_samples(d.scrape())
            assert metric_value(got, "gated_gpu_fallbacks_total") == 1
            assert metric_value(got, "gated_rollbacks_total") >= 3
            info = metric_value(got, "gated_backend_info", backend="numpy", device="cpu")
            assert info == 1
            reasons = [lab["reason"] for lab, _ in got["gated_backend_info"]]
            assert any("switched from the GPU" in r and "StandInCudaError" in r
                       for r in reasons)
            # training goes on (on the CPU) and publishes
            version = st["version"]
            c.signals(_signals(100, start=1000))
            st = wait_until(lambda: (s := c.status())["queue_depth"] == 0
                            and s["version"] > version + 1 and s, what="training on the CPU")
            assert st["last_trained_seq"] == 300 and st["backend"] == "numpy"
            assert 0.0 <= c.predict("bash cat notes/1.txt")["p_allow"] <= 1.0
            assert metric_value(metric_samples(d.scrape()), "gated_gpu_fallbacks_total") == 1
        log = d.log()
        assert "GPU 0 Stand-in GPU 80GB: 80.00 GiB total, 70.00 GiB free" in log
        assert "13 kernels compiled" in log
        assert "GPU training failed 3 times in a row (last error: StandInCudaError" in log
        assert "switched to the CPU; weights and optimizer state kept" in log
    finally:
        assert d.stop() == 0


def test_daemon_preflight_auto_uses_the_cpu_and_cuda_refuses_to_start(tmp_path):
    small = {"GATED_STANDIN_FREE_MIB": "8", "GATED_STANDIN_TOTAL_MIB": "16"}
    (tmp_path / "auto").mkdir()
    d = start(tmp_path / "auto", extra=["--device", "auto"], launcher=STANDIN_DAEMON,
              env=small)
    try:
        with d.client() as c:
            st = c.status()
            assert (st["backend"], st["device"]) == ("numpy", "cpu")
        got = metric_samples(d.scrape())
        assert metric_value(got, "gated_gpu_fallbacks_total") == 1
        reason = [lab["reason"] for lab, _ in got["gated_backend_info"]][0]
        assert reason.startswith("device=auto: the GPU preflight failed: this configuration "
                                 "needs about")
        assert "8 MiB free of 16 MiB" in reason and "lower train.batch_size" in reason
        assert metric_value(got, "gated_device_memory_bytes", kind="free") == 8 << 20
        assert "WARNING gated: compute backend numpy on cpu (device=auto: the GPU preflight " \
            "failed" in d.log()
    finally:
        assert d.stop() == 0

    (tmp_path / "cuda").mkdir()
    d = start(tmp_path / "cuda", extra=["--device", "cuda"], launcher=STANDIN_DAEMON,
              env=small, wait=False)
    assert d.proc.wait(timeout=60) == 1
    log = d.log()
    assert "gated could not start: device=cuda: the GPU preflight failed: this " \
           "configuration needs about" in log
    assert "lower train.batch_size" in log and 'device = "cpu"' in log
    assert not (tmp_path / "cuda" / "state").exists()  # refused before touching the state
