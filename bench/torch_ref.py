"""An independent PyTorch (eager) reference of gated's encoder-decoder gate model.

Written from DESIGN.md section 1 alone, not from gated's code, so that it can check the
hand-written NumPy backward (tests/test_torch_parity.py) and serve as the PyTorch side of
the step benchmark (bench/bench_step.py). PyTorch is NOT a dependency of gated: this
module imports it at top level and is only used where it is installed.

Parameter names (``model.named_parameters()``) are exactly the DESIGN layout names
(``tok_emb``, ``enc.0.ln1.g``, ``enc.0.attn.wq``, ..., ``dec.1.cross.bk``, ``dec.ln.b``,
``out.w``, ``gate.b``), registered in layout order, so::

    ref = TorchGateModel(cfg, dtype=torch.float64)
    load_from_flat(ref, gated_model.params)

copies every named NumPy array in. Math, per DESIGN:

- byte vocab, shared embedding ``E``, ``x = E[tok] + PE[pos]`` (fixed sinusoidal), plus
  the segment embedding ``S[seg]`` on the source (0: the current call, 1: its history);
- Linear ``y = x @ W.T + b`` with ``W`` stored ``[out, in]``; LayerNorm with biased
  variance; tanh-GELU; heads are contiguous slices of ``d_model``, scores scaled by
  ``1/sqrt(d_head)``, masked scores are -inf before the softmax;
- encoder: pre-LN layers, bidirectional self-attention with PAD keys masked, ``LN_enc``;
- decoder: pre-LN layers, causal self-attention, cross-attention over ``enc`` with the
  source PAD keys masked, FFN; ``LN_dec``; untied output projection;
- gate head on ``[mean-pool(enc over the call), mean-pool(enc over the history)]``
  (each pool divides by max(1, its token count): an empty history pools to zeros);
- no wide path: the reference is the transformer, so compare with ``wide_buckets=0``
  (the wide path has its own central-difference checks, tests/test_wide.py and
  test_wide_pair.py);
- loss ``lambda_bce * (1/B) sum_i w_i l_i + lambda_ce * CE`` with CE the sum over non-PAD
  targets divided by ``max(1, count)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PAD, BOS, EOS, SEP = 256, 257, 258, 259


def sinusoidal_pe(max_len: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)).

    Computed in float64, then cast (as the NumPy engine does).
    """
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    div = torch.pow(torch.tensor(10000.0, dtype=torch.float64),
                    torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.zeros(max_len, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos / div)
    pe[:, 1::2] = torch.cos(pos / div)
    return pe.to(dtype)


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape, dtype=dtype))


class LayerNormP(nn.Module):
    """LayerNorm parameters ``g`` (gain) and ``b`` (bias)."""

    def __init__(self, d: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.ones(d, dtype=dtype))
        self.b = _param(d, dtype=dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.g, self.b, self.eps)


class AttentionP(nn.Module):
    """Multi-head attention with DESIGN's parameter names: wq bq wk bk wv bv wo bo."""

    def __init__(self, d: int, n_heads: int, dtype: torch.dtype, impl: str) -> None:
        super().__init__()
        for proj in ("q", "k", "v", "o"):
            setattr(self, f"w{proj}", _param(d, d, dtype=dtype))
            setattr(self, f"b{proj}", _param(d, dtype=dtype))
        self.n_heads = n_heads
        self.impl = impl

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)

    def forward(self, xq: torch.Tensor, xkv: torch.Tensor, key_keep: torch.Tensor | None,
                causal: bool) -> torch.Tensor:
        """``key_keep``: bool [B, Tk], True for keys that may be attended (None = all)."""
        q = self._split(F.linear(xq, self.wq, self.bq))
        k = self._split(F.linear(xkv, self.wk, self.bk))
        v = self._split(F.linear(xkv, self.wv, self.bv))
        mask = None if key_keep is None else key_keep[:, None, None, :]
        if self.impl == "sdpa":
            # Bool mask: True takes part. Default scale is 1/sqrt(q.shape[-1]) = 1/sqrt(d_head).
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        else:
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
            if causal:
                tq, tk = s.shape[-2], s.shape[-1]
                tri = torch.ones(tq, tk, dtype=torch.bool, device=s.device).tril()
                s = s.masked_fill(~tri, float("-inf"))
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            o = torch.softmax(s, dim=-1) @ v
        b, h, t, dh = o.shape
        o = o.transpose(1, 2).reshape(b, t, h * dh)
        return F.linear(o, self.wo, self.bo)


class FFNP(nn.Module):
    """``w2 gelu_tanh(w1 x + b1) + b2`` with w1 [f, d], w2 [d, f]."""

    def __init__(self, d: int, f: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.w1 = _param(f, d, dtype=dtype)
        self.b1 = _param(f, dtype=dtype)
        self.w2 = _param(d, f, dtype=dtype)
        self.b2 = _param(d, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.gelu(F.linear(x, self.w1, self.b1), approximate="tanh"),
                        self.w2, self.b2)


class EncLayer(nn.Module):
    """``h = x + SelfAttn(LN1 x)``, ``x' = h + FFN(LN2 h)``; names ln1 attn ln2 ffn."""

    def __init__(self, cfg: Any, dtype: torch.dtype, impl: str) -> None:
        super().__init__()
        d = cfg.d_model
        self.ln1 = LayerNormP(d, cfg.ln_eps, dtype)
        self.attn = AttentionP(d, cfg.n_heads, dtype, impl)
        self.ln2 = LayerNormP(d, cfg.ln_eps, dtype)
        self.ffn = FFNP(d, cfg.d_ff, dtype)

    def forward(self, x: torch.Tensor, src_keep: torch.Tensor) -> torch.Tensor:
        a = self.ln1(x)
        h = x + self.attn(a, a, src_keep, causal=False)
        return h + self.ffn(self.ln2(h))


class DecLayer(nn.Module):
    """Causal self-attn, cross-attn over enc, FFN; names ln1 self ln2 cross ln3 ffn."""

    def __init__(self, cfg: Any, dtype: torch.dtype, impl: str) -> None:
        super().__init__()
        d = cfg.d_model
        self.ln1 = LayerNormP(d, cfg.ln_eps, dtype)
        # `self` is a Python keyword only as a parameter name; as an attribute it is fine,
        # but add_module keeps the intent explicit.
        self.add_module("self", AttentionP(d, cfg.n_heads, dtype, impl))
        self.ln2 = LayerNormP(d, cfg.ln_eps, dtype)
        self.cross = AttentionP(d, cfg.n_heads, dtype, impl)
        self.ln3 = LayerNormP(d, cfg.ln_eps, dtype)
        self.ffn = FFNP(d, cfg.d_ff, dtype)

    def forward(self, x: torch.Tensor, enc: torch.Tensor, src_keep: torch.Tensor) -> torch.Tensor:
        self_attn: AttentionP = self._modules["self"]  # type: ignore[assignment]
        s = self.ln1(x)
        h1 = x + self_attn(s, s, None, causal=True)
        h2 = h1 + self.cross(self.ln2(h1), enc, src_keep, causal=False)
        return h2 + self.ffn(self.ln3(h2))


class Head(nn.Module):
    """A Linear with DESIGN's names ``w`` [out, in] and ``b`` [out]."""

    def __init__(self, n_out: int, n_in: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.w = _param(n_out, n_in, dtype=dtype)
        self.b = _param(n_out, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w, self.b)


class TorchGateModel(nn.Module):
    """The whole model; ``named_parameters()`` yields DESIGN's names in layout order.

    ``cfg`` is any object with gated's ModelConfig fields. ``attn_impl`` is ``"sdpa"``
    (F.scaled_dot_product_attention with a boolean key mask / is_causal) or ``"manual"``
    (explicit scores, -inf masking and softmax). Weights start at zero except LayerNorm
    gains; load real weights with :func:`load_from_flat`.
    """

    def __init__(self, cfg: Any, dtype: torch.dtype = torch.float32,
                 attn_impl: str = "sdpa", lambda_bce: float = 1.0,
                 lambda_ce: float = 0.5) -> None:
        super().__init__()
        if attn_impl not in ("sdpa", "manual"):
            raise ValueError(f"attn_impl must be 'sdpa' or 'manual', got {attn_impl!r}")
        self.cfg = cfg
        self.lambda_bce, self.lambda_ce = lambda_bce, lambda_ce
        d, v = cfg.d_model, cfg.vocab_size
        self.tok_emb = _param(v, d, dtype=dtype)
        self.seg_emb = _param(2, d, dtype=dtype)
        enc: dict[str, nn.Module] = {str(i): EncLayer(cfg, dtype, attn_impl)
                                     for i in range(cfg.n_enc_layers)}
        enc["ln"] = LayerNormP(d, cfg.ln_eps, dtype)
        self.enc = nn.ModuleDict(enc)
        dec: dict[str, nn.Module] = {str(i): DecLayer(cfg, dtype, attn_impl)
                                     for i in range(cfg.n_dec_layers)}
        dec["ln"] = LayerNormP(d, cfg.ln_eps, dtype)
        self.dec = nn.ModuleDict(dec)
        self.out = Head(v, d, dtype)
        self.gate = Head(1, 2 * d, dtype)
        self.register_buffer("pe", sinusoidal_pe(cfg.max_seq_len, d, dtype), persistent=False)

    # --- forward pieces -----------------------------------------------------------------
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``E[tok] + PE[pos]``."""
        return F.embedding(tokens, self.tok_emb) + self.pe[: tokens.shape[1]]

    def encode(self, src: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
        """``enc = LN_enc(encoder layers(E[src] + PE + S[seg]))`` with PAD keys masked."""
        keep = src != PAD
        x = self.embed(src) + F.embedding(seg, self.seg_emb)
        for i in range(self.cfg.n_enc_layers):
            x = self.enc[str(i)](x, keep)
        return self.enc["ln"](x)

    def gate_logit(self, enc: torch.Tensor, src: torch.Tensor, seg: torch.Tensor
                   ) -> torch.Tensor:
        """``z = [pool(call), pool(history)] @ gate.w.T + gate.b``, shape [B]."""
        keep = src != PAD
        pools = []
        for m in (keep & (seg == 0), keep & (seg != 0)):
            m = m.to(enc.dtype)
            pools.append((enc * m[:, :, None]).sum(dim=1)
                         / m.sum(dim=1, keepdim=True).clamp(min=1.0))
        return self.gate(torch.cat(pools, dim=1))[:, 0]

    def decode(self, tgt_in: torch.Tensor, enc: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] of the decoder over ``tgt_in`` given ``enc``."""
        keep = src != PAD
        y = self.embed(tgt_in)
        for i in range(self.cfg.n_dec_layers):
            y = self.dec[str(i)](y, enc, keep)
        return self.out(self.dec["ln"](y))

    def losses(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor,
                                                                  torch.Tensor]:
        """(total, bce, ce) for a batch of tensors (see :func:`batch_to_torch`)."""
        bce, ce_sum = self._bce_and_ce_sum(batch)
        # The count stays a tensor: no host sync, so the step can be captured in a graph.
        ce = ce_sum / (batch["tgt_out"] != PAD).sum().clamp(min=1)
        return self.lambda_bce * bce + self.lambda_ce * ce, bce, ce

    def chunk_loss(self, batch: Mapping[str, torch.Tensor], share: float,
                   ce_count: int) -> torch.Tensor:
        """The loss of `batch` as the part `share` of a larger batch whose CE counts
        `ce_count` target tokens: summed over that batch's length chunks (gated's
        `length_chunks`) it is the whole batch's loss, formed as gated's
        `Model.loss_parts_and_grads` forms it; a chunk without target tokens skips the
        decoder, as gated's step does."""
        bce, ce_sum = self._bce_and_ce_sum(batch, decode=bool((batch["tgt_out"] != PAD).any()))
        return self.lambda_bce * share * bce + self.lambda_ce * ce_sum / max(1, ce_count)

    def _bce_and_ce_sum(self, batch: Mapping[str, torch.Tensor], decode: bool = True
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the batch's weighted BCE mean, its decoder CE summed over target tokens)."""
        src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
        seg = batch["seg"] if "seg" in batch else torch.zeros_like(src)
        enc = self.encode(src, seg)
        z = self.gate_logit(enc, src, seg)
        # reduction="mean" with weight=w is (1/B) sum_i w_i l_i, in the stable form.
        bce = F.binary_cross_entropy_with_logits(z, batch["label"], weight=batch["weight"],
                                                 reduction="mean")
        if not decode:
            return bce, torch.zeros((), dtype=bce.dtype)
        logits = self.decode(tgt_in, enc, src)
        ce_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1),
                                 ignore_index=PAD, reduction="sum")
        return bce, ce_sum

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The total loss."""
        return self.losses(batch)[0]


def batch_to_torch(batch: Mapping[str, Any], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """gated's numpy batch dict -> tensors (int64 ids, ``dtype`` label/weight)."""
    out = {k: torch.as_tensor(np.asarray(batch[k]), dtype=torch.int64)
           for k in ("src", "seg", "tgt_in", "tgt_out") if k in batch}
    for k in ("label", "weight"):
        out[k] = torch.as_tensor(np.asarray(batch[k]), dtype=dtype)
    return out


@torch.no_grad()
def load_from_flat(model: TorchGateModel, params: Mapping[str, Any]) -> None:
    """Copy each named array of ``params`` (gated's ``model.params``) into ``model``.

    Names and shapes must match one-to-one; a missing, extra or misshapen name raises.
    """
    own = dict(model.named_parameters())
    missing, extra = set(own) - set(params), set(params) - set(own)
    if missing or extra:
        raise KeyError(f"layout mismatch: missing {sorted(missing)}, extra {sorted(extra)}")
    for name, p in own.items():
        src = torch.as_tensor(np.asarray(params[name]))
        if tuple(src.shape) != tuple(p.shape):
            raise ValueError(f"{name}: shape {tuple(src.shape)} != {tuple(p.shape)}")
        p.copy_(src.to(p.dtype))


def grads_as_numpy(model: TorchGateModel) -> dict[str, np.ndarray]:
    """name -> gradient (zeros where autograd left None)."""
    return {n: (np.zeros(tuple(p.shape)) if p.grad is None else p.grad.detach().numpy().copy())
            for n, p in model.named_parameters()}


def adamw_param_groups(model: TorchGateModel, weight_decay: float) -> list[dict[str, Any]]:
    """DESIGN's decay rule: weight decay on 2-D matrices (embedding included) only."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.ndim == 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim != 2], "weight_decay": 0.0}]
