"""The flat parameter layout of DESIGN.md section 1.

Every parameter is a view into ONE contiguous buffer, in a fixed order, so that the
optimiser runs one pass over flat buffers and a checkpoint is one array plus this index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig

Shape = tuple[int, ...]


def _attn(prefix: str, d: int) -> list[tuple[str, Shape]]:
    out: list[tuple[str, Shape]] = []
    for proj in ("q", "k", "v", "o"):
        out += [(f"{prefix}.w{proj}", (d, d)), (f"{prefix}.b{proj}", (d,))]
    return out


def _ln(prefix: str, d: int) -> list[tuple[str, Shape]]:
    return [(f"{prefix}.g", (d,)), (f"{prefix}.b", (d,))]


def _ffn(prefix: str, d: int, f: int) -> list[tuple[str, Shape]]:
    return [(f"{prefix}.w1", (f, d)), (f"{prefix}.b1", (f,)),
            (f"{prefix}.w2", (d, f)), (f"{prefix}.b2", (d,))]


def param_layout(cfg: ModelConfig) -> list[tuple[str, Shape]]:
    """(name, shape) of every parameter in checkpoint order."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    layout: list[tuple[str, Shape]] = [("tok_emb", (v, d)), ("seg_emb", (2, d))]
    for i in range(cfg.n_enc_layers):
        p = f"enc.{i}"
        layout += _ln(f"{p}.ln1", d) + _attn(f"{p}.attn", d)
        layout += _ln(f"{p}.ln2", d) + _ffn(f"{p}.ffn", d, f)
    layout += _ln("enc.ln", d)
    for i in range(cfg.n_dec_layers):
        p = f"dec.{i}"
        layout += _ln(f"{p}.ln1", d) + _attn(f"{p}.self", d)
        layout += _ln(f"{p}.ln2", d) + _attn(f"{p}.cross", d)
        layout += _ln(f"{p}.ln3", d) + _ffn(f"{p}.ffn", d, f)
    layout += _ln("dec.ln", d)
    # The gate reads the pooled current call and the pooled history side by side.
    layout += [("out.w", (v, d)), ("out.b", (v,)), ("gate.w", (1, 2 * d)), ("gate.b", (1,))]
    if cfg.wide_buckets:
        # one row of weights per member of the bag (`ModelConfig.wide_members`), and each
        # pair table as the members' tables one after the other (member m's rows start at
        # m times one member's rows: engine/wide_logit.py `member_offsets`)
        members = cfg.wide_members
        layout += [("wide.w", (members, cfg.wide_buckets))]
        if cfg.wide_pair_rank:  # the call x history pair term's two factor tables
            layout += [("wide.pair_call", (members * cfg.pair_call_rows, cfg.wide_pair_rank)),
                       ("wide.pair_hist", (members * cfg.wide_pair_buckets,
                                           cfg.wide_pair_rank))]
    return layout


@dataclass(frozen=True)
class Slot:
    name: str
    shape: Shape
    offset: int
    size: int


def slots(layout: list[tuple[str, Shape]]) -> list[Slot]:
    out, offset = [], 0
    for name, shape in layout:
        size = int(np.prod(shape))
        out.append(Slot(name, tuple(shape), offset, size))
        offset += size
    return out


def num_params(layout: list[tuple[str, Shape]]) -> int:
    return sum(int(np.prod(s)) for _, s in layout)


def views(flat, layout: list[tuple[str, Shape]]) -> dict:
    """Named views into `flat` (numpy or cupy): writing a view writes the buffer."""
    return {s.name: flat[s.offset : s.offset + s.size].reshape(s.shape) for s in slots(layout)}


def decay_mask(layout: list[tuple[str, Shape]]) -> np.ndarray:
    """1.0 where AdamW applies weight decay (2-D matrices, embedding included), else 0.0."""
    mask = np.zeros(num_params(layout), dtype=np.float32)
    for s in slots(layout):
        if len(s.shape) == 2:
            mask[s.offset : s.offset + s.size] = 1.0
    return mask


EMBEDDING_STD = 1.0
MATRIX_STD = 0.02


def init_flat(layout: list[tuple[str, Shape]], seed: int, pair_init: float = 0.1,
              pair_shared: bool = True, pair_zero_rows: int = 0) -> np.ndarray:
    """Deterministic float64 initial weights: N(0, 1) token and segment embeddings,
    N(0, 0.02) other matrices, zero wide weights and biases, unit LayerNorm gains.

    The embedding is N(0, 1) (PyTorch's nn.Embedding default) because x = E[tok] + PE[pos]
    adds it to a sinusoidal encoding of unit scale: at 0.02 the token identity is a 2%
    ripple on the position signal and the model sits on a majority-class plateau for
    hundreds of steps before attention learns to find the current call (measured in
    docs/benchmarks.md, learning). Generated in float64 so float32 and float64 models from
    one seed hold the same values up to rounding (the gradient checks rely on it).
    """
    rng = np.random.default_rng(seed)
    flat = np.zeros(num_params(layout), dtype=np.float64)
    # With a wide path the transformer's gate weights start at zero, as the last layer of
    # a residual branch does: at first the wide path decides alone (it learns from the
    # first signals), and the transformer's logit joins as it learns instead of adding
    # noise of ~0.5 logits from random features (measured: docs/benchmarks.md).
    wide = any(name == "wide.w" for name, _ in layout)
    # the wide path's members (`ModelConfig.wide_members`): one row of "wide.w" each
    members = next((shape[0] for name, shape in layout if name == "wide.w"), 1)
    for s in slots(layout):
        leaf = s.name.rsplit(".", 1)[-1]
        chunk = flat[s.offset : s.offset + s.size]
        if s.name in ("tok_emb", "seg_emb"):
            chunk[:] = rng.normal(0.0, EMBEDDING_STD, size=s.size)
        elif s.name in ("wide.w", "wide.pair_hist") or (wide and s.name == "gate.w"):
            continue  # zero: the wide path starts silent, and so does the gate over it
        elif s.name == "wide.pair_call":
            # random, so the history side's first gradients (dz * u) point somewhere; the
            # history side's zeros keep the product silent until it has learned. The
            # members of a bag (`members` tables one after the other) start equal: they
            # differ only by what they draw to learn (wide_learner.py `WideBag`)
            first = chunk[: s.size // members]
            first[:] = rng.normal(0.0, pair_init, size=first.size)
            table = first.reshape(-1, s.shape[1])
            if pair_shared:
                # ... and, with `pair_shared`, one factor shared by every call: what the
                # history side learns from one call's examples then speaks for every call
                # until the call side learns which it applies to. With all factors random,
                # an e-mail learned from an HTTP POST's exfiltrations only by the chance
                # overlap of their random rows, and how early the history rule held
                # depended on the seed (docs/learning.md, "The pair term's shared factor").
                table[:, 0] = pair_init
            if pair_zero_rows:
                # the destination keys' rows (`ModelConfig.pair_destination_rows`) have no
                # factor of their own at first: a destination says nothing of its own
                # until it has learned "allow"; drawn and then zeroed, so every other row
                # keeps its value. With `pair_shared` they keep the shared factor, as
                # every call row does: an upload after a secret read to a host never seen
                # gets the history rule's "block" from its destination row too (measured:
                # docs/learning.md, "The destination rows' shared factor")
                own = 1 if pair_shared else 0  # the first column of their own factors
                table[-pair_zero_rows:, own:] = 0.0
            chunk.reshape(members, -1)[1:] = first  # every member from the same start
        elif len(s.shape) == 2:
            chunk[:] = rng.normal(0.0, MATRIX_STD, size=s.size)
        elif leaf == "g":
            chunk[:] = 1.0
    return flat
