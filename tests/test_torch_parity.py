"""Cross-check against an independent PyTorch autograd reference (bench/torch_ref.py).

PyTorch is not a dependency of gated (CI has none), so this whole module skips without
it. Where it is installed it checks, for the `tiny` preset in float64:

- the loss equals gated's `model.loss` to 1e-10 relative;
- every gradient tensor of `model.loss_and_grads` equals torch autograd to 1e-8 of the
  tensor's max abs (padded sources, an example without a reason, a length-1 target,
  a batch with no reasons at all);
- gated's AdamW (global-norm clipping, decay on 2-D matrices only) equals
  `torch.optim.AdamW` + `clip_grad_norm_` over 3 steps, to float64 rounding.

Both attention paths of the reference (explicit softmax and scaled_dot_product_attention)
are checked.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed (optional cross-check)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.torch_ref import (  # noqa: E402
    TorchGateModel,
    adamw_param_groups,
    batch_to_torch,
    grads_as_numpy,
    load_from_flat,
)
from gated.engine import BOS, EOS, PAD, AdamW, Model, ModelConfig, build_batch  # noqa: E402
from gated.engine.model import length_chunks  # noqa: E402

LOSS_RTOL = 1e-10
GRAD_RTOL = 1e-8
# Some gradients are exactly zero in exact arithmetic: every attention key bias bk (the
# softmax is invariant to adding q.bk to a whole row of scores), and wq/bq/wk/bk of a
# causal self-attention when T = 1 (a softmax over one key is 1). Both sides then hold
# rounding noise (~1e-16 of the largest gradient, or exact 0), which "1e-8 of the
# tensor's max abs" cannot compare; such tensors must stay below this fraction of the
# model's largest gradient on both sides.
ZERO_LEVEL = 1e-13
# The optimiser check feeds both optimisers the same gradients, so the only differences
# left are float64 rounding of the update expressions.
PARAM_RTOL = 1e-14


def _model(weights: str) -> Model:
    """tiny in float64: the seeded init, or O(1) random weights (no gradient hides)."""
    # The transformer alone: the reference has no wide path (tests/test_wide.py and
    # test_wide_pair.py check it).
    m = Model.init(dataclasses.replace(ModelConfig.tiny(), wide_buckets=0), seed=0,
                   dtype="float64")
    if weights == "random":
        rng = np.random.default_rng(123)
        for name, arr in m.params.items():
            if name.endswith(".g"):
                arr[...] = 1.0 + rng.normal(0, 0.2, arr.shape)
            else:
                arr[...] = rng.normal(0, 0.3 if arr.ndim == 2 else 0.1, arr.shape)
    return m


def _batch(kind: str, cfg: ModelConfig) -> dict:
    if kind == "mixed":
        # Sources of different lengths (PAD-padded, one truncated to max_seq_len), one
        # example without a reason, a 1-byte reason (tgt_in [BOS, x], tgt_out [x, EOS]).
        return build_batch([
            {"context": "rm -rf /", "history": ["ls -la", "cd /tmp"], "reason": "deletes root",
             "label": 0, "weight": 4.0},
            {"context": "cat a.txt", "history": None, "reason": None, "label": 1, "weight": 1.0},
            {"context": "curl x | sh", "history": [], "reason": "p", "label": 0, "weight": 2.0},
            {"context": "write_file src/main.py " + "x" * 40, "history": ["git status"],
             "reason": "project write", "label": 1, "weight": 6.0},
        ], cfg)
    if kind == "length_one":
        # T = 1: one target of exactly one token (EOS), one example without any.
        return {"src": np.array([[259, 97, 98, PAD, PAD], [259, 99, 100, 101, 102]]),
                "tgt_in": np.array([[BOS], [BOS]]), "tgt_out": np.array([[EOS], [PAD]]),
                "label": np.array([1.0, 0.0]), "weight": np.array([1.0, 6.0])}
    if kind == "no_reasons":
        return build_batch([
            {"context": "ls", "history": None, "reason": None, "label": 1, "weight": 1.0},
            {"context": "rm -rf ~", "history": ["pwd"], "reason": None, "label": 0,
             "weight": 2.0},
        ], cfg)
    raise ValueError(kind)


def _torch_model(model: Model, attn_impl: str) -> TorchGateModel:
    ref = TorchGateModel(model.cfg, dtype=torch.float64, attn_impl=attn_impl,
                         lambda_bce=model.lambda_bce, lambda_ce=model.lambda_ce)
    load_from_flat(ref, model.params)
    return ref


def test_reference_in_length_chunks_equals_the_whole_batch() -> None:
    """bench_step's equal-work PyTorch side: `chunk_loss` summed over gated's length
    chunks (a chunk without reasons among them) is the whole batch's loss, and its
    gradients, accumulated chunk by chunk, the whole batch's; gated's chunked step is the
    same loss and gradient too."""
    model = _model("random")
    batch = _batch("mixed", model.cfg)
    ref = _torch_model(model, "manual")
    ref.losses(batch_to_torch(batch, torch.float64))[0].backward()
    whole = grads_as_numpy(ref)
    ref.zero_grad(set_to_none=True)
    n_targets = int(np.count_nonzero(batch["tgt_out"] != PAD))
    total, b = 0.0, len(batch["label"])
    for rows, part in length_chunks(batch, 1):
        loss = ref.chunk_loss(batch_to_torch(part, torch.float64), rows.size / b, n_targets)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(model.loss(batch)[0], rel=1e-12)
    chunked = grads_as_numpy(ref)
    g_max = max(float(np.abs(g).max()) for g in whole.values())
    for name, g in whole.items():
        np.testing.assert_allclose(chunked[name], g, rtol=0, atol=1e-11 * g_max, err_msg=name)
    gated_total, _ = model.loss_parts_and_grads(batch, chunk_rows=1)
    assert gated_total == pytest.approx(total, rel=1e-12)


@pytest.mark.parametrize("attn_impl", ["manual", "sdpa"])
@pytest.mark.parametrize("weights", ["init", "random"])
@pytest.mark.parametrize("kind", ["mixed", "length_one", "no_reasons"])
def test_loss_and_every_gradient_match_torch_autograd(kind: str, weights: str,
                                                      attn_impl: str) -> None:
    model = _model(weights)
    batch = _batch(kind, model.cfg)
    ref = _torch_model(model, attn_impl)
    tb = batch_to_torch(batch, torch.float64)

    total, bce, ce = ref.losses(tb)
    total.backward()
    t_grads = grads_as_numpy(ref)

    loss, parts = model.loss(batch)
    assert abs(loss - total.item()) <= LOSS_RTOL * abs(total.item()), (loss, total.item())
    assert abs(parts["bce"] - bce.item()) <= LOSS_RTOL * abs(bce.item())
    assert abs(parts["ce"] - ce.item()) <= LOSS_RTOL * max(abs(ce.item()), 1e-300)

    loss2, grads = model.loss_and_grads(batch)
    assert loss2 == pytest.approx(loss, rel=1e-14)
    assert set(grads) == set(t_grads)
    g_max = max(float(np.abs(tg).max()) for tg in t_grads.values())
    failures = []
    for name, tg in t_grads.items():
        g = np.asarray(grads[name])
        assert g.shape == tg.shape, name
        scale = float(np.abs(tg).max())
        if max(scale, float(np.abs(g).max())) <= ZERO_LEVEL * g_max:
            # Exactly zero in exact arithmetic (see ZERO_LEVEL): rounding noise on both sides.
            continue
        err = float(np.abs(g - tg).max())
        if err > GRAD_RTOL * scale:
            failures.append(f"{name}: max|diff| {err:.3e} vs max|grad| {scale:.3e}")
    assert not failures, "\n".join(failures)
    if kind == "no_reasons":
        # No target token: the decoder gets exactly no gradient on either side.
        assert np.all(grads["out.w"] == 0) and np.all(t_grads["out.w"] == 0)


def test_adamw_with_clipping_matches_torch_over_three_steps() -> None:
    """gated AdamW vs torch.optim.AdamW (2-D-only decay groups) + clip_grad_norm_.

    Each step gated computes the gradient at its current weights and torch's optimiser
    gets that same gradient in `.grad` (autograd parity is the test above). With each side
    using its own autograd, Adam's division by sqrt(v) + eps would turn the rounding noise
    of the exactly-zero bk gradients into lr * 1e-8-sized steps and hide what this checks.
    """
    lr, betas, eps, wd, clip = 3e-2, (0.9, 0.98), 1e-8, 0.1, 0.5
    model = _model("random")
    cfg = model.cfg
    batches = [_batch("mixed", cfg), _batch("length_one", cfg), _batch("mixed", cfg)]
    ref = _torch_model(model, "manual")
    named = dict(ref.named_parameters())
    t_opt = torch.optim.AdamW(adamw_param_groups(ref, wd), lr=lr, betas=betas, eps=eps,
                              weight_decay=wd, foreach=False)
    opt = AdamW.for_model(model, lr=lr, betas=betas, eps=eps, weight_decay=wd, clip_norm=clip)
    start = {n: a.copy() for n, a in model.params.items()}

    for step, batch in enumerate(batches, start=1):
        model.loss_and_grads(batch)
        for name, p in named.items():
            p.grad = torch.from_numpy(np.array(model.grads[name], copy=True))
        info = opt.step(model.flat, model.grad_flat)
        t_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        t_opt.step()

        assert info["grad_norm"] == pytest.approx(t_norm.item(), rel=1e-13)
        assert info["grad_norm"] > clip, "clipping must be exercised"
        assert opt.t == step
        for name, p in named.items():
            tp = p.detach().numpy()
            err = float(np.abs(model.params[name] - tp).max())
            assert err <= PARAM_RTOL * max(1.0, float(np.abs(tp).max())), (
                f"step {step}: {name} differs by {err:.3e}")

    # The optimiser really moved weights, biases and gains.
    for name in ("tok_emb", "enc.0.ln1.g", "dec.1.cross.bv", "gate.b"):
        assert np.abs(model.params[name] - start[name]).max() > 1e-4, name
    # First and second moments agree too (flat layout == named_parameters order).
    t_m = np.concatenate([t_opt.state[p]["exp_avg"].numpy().ravel() for p in ref.parameters()])
    t_v = np.concatenate([t_opt.state[p]["exp_avg_sq"].numpy().ravel()
                          for p in ref.parameters()])
    assert np.abs(opt.m - t_m).max() <= 1e-13 * np.abs(t_m).max()
    assert np.abs(opt.v - t_v).max() <= 1e-13 * np.abs(t_v).max()


def test_adamw_decay_only_on_matrices_matches_torch() -> None:
    """Zero gradients isolate the decoupled decay: only 2-D tensors shrink, as in torch."""
    lr, wd = 0.5, 0.2
    model = _model("random")
    ref = _torch_model(model, "manual")
    t_opt = torch.optim.AdamW(adamw_param_groups(ref, wd), lr=lr, weight_decay=wd)
    opt = AdamW.for_model(model, lr=lr, weight_decay=wd, clip_norm=1.0)
    before = {n: a.copy() for n, a in model.params.items()}
    model.grad_flat[...] = 0.0
    for p in ref.parameters():
        p.grad = torch.zeros_like(p)
    opt.step(model.flat, model.grad_flat)
    t_opt.step()
    for name, p in ref.named_parameters():
        expect = before[name] * (1.0 - lr * wd) if p.ndim == 2 else before[name]
        np.testing.assert_allclose(model.params[name], expect, rtol=1e-15, atol=0, err_msg=name)
        np.testing.assert_allclose(p.detach().numpy(), expect, rtol=1e-15, atol=0,
                                   err_msg=name)
