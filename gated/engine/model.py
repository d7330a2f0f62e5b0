"""The encoder-decoder gate model: forward, exact hand-written backward, losses.

Read top to bottom: embedding, encoder, gate head, decoder, losses, then the backward
pass in reverse order. All parameters live in one flat buffer (see layout.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

import numpy as np

from . import layers as L
from .config import ModelConfig
from .layout import decay_mask, init_flat, num_params, param_layout, views
from .ops_numpy import NumpyOps
from .tokenizer import BOS, EOS, PAD, decode_bytes
from .wide import MAX_STRUCTURED, PAIR_KEYS, wide_feature_keys
from .wide_logit import (
    familiarity_of,
    member_offsets,
    pair_logit,
    read_values,
    shifted,
    veto_combine,
    wide_logit_host,
    wide_table,
)

_T = TypeVar("_T")


class ChunkCores(Protocol):
    """Runs a round of a step's chunk jobs at once, one per core, and returns their
    results in order; every job has finished when it returns, or raises. The engine
    starts no threads itself: daemon/trainer/cores.py is the daemon's."""

    width: int

    def run(self, jobs: Sequence[Callable[[], _T]]) -> list[_T]: ...


def _add_twins(dst: np.ndarray, parts: list[np.ndarray]) -> None:
    for part in parts:
        dst += part


def get_ops(backend: str) -> NumpyOps:
    """The backend seam: "numpy" now; "cupy" adds GPU kernels behind the same methods."""
    if backend == "numpy":
        return NumpyOps()
    if backend == "cupy":
        from .ops_cupy import CupyOps  # imported lazily: CuPy is an optional extra

        return CupyOps()
    raise ValueError(f"unknown backend {backend!r}; use 'numpy' or 'cupy'")


def length_chunks(batch: dict[str, np.ndarray], size: int):
    """Rows of a host batch in chunks of `size` rows of similar source length, each chunk's
    sources (and reasons, in a training batch) cut to its own longest: yields (rows, part).

    A batch padded to its longest source spends most of its attention (quadratic in length)
    and GELU work on PAD; rows do not depend on each other, so chunking changes the cost,
    not the values (the caller weights each chunk's loss)."""
    lengths = (batch["src"] != PAD).sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    for start in range(0, order.size, size):
        rows = order[start: start + size]
        part = {k: v[rows] for k, v in batch.items()}
        s_len = max(1, int(lengths[rows].max()))
        for k in ("src", "seg"):
            if k in part:
                part[k] = part[k][:, :s_len]
        if "tgt_in" in part:
            t_len = max(1, int((part["tgt_in"] != PAD).sum(axis=1).max()))
            part["tgt_in"], part["tgt_out"] = part["tgt_in"][:, :t_len], part["tgt_out"][:, :t_len]
        yield rows, part


def sinusoidal_positions(max_len: int, d: int) -> np.ndarray:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)), float64."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    div = np.power(10000.0, np.arange(0, d, 2, dtype=np.float64) / d)
    pe = np.zeros((max_len, d), dtype=np.float64)
    pe[:, 0::2] = np.sin(pos / div)
    pe[:, 1::2] = np.cos(pos / div)
    return pe


class Model:
    """Parameters (one flat buffer + named views), gradients (same layout), the math."""

    def __init__(self, cfg: ModelConfig, flat, ops: NumpyOps, dtype: str) -> None:
        xp = ops.xp
        self.cfg, self.ops, self.dtype = cfg, ops, np.dtype(dtype)
        supported = getattr(ops, "dtypes", None)
        if supported is not None and self.dtype not in supported:
            raise ValueError(f"the {ops.name} backend computes in "
                             f"{', '.join(map(str, supported))}, not {self.dtype}")
        self.layout = param_layout(cfg)
        if flat.shape != (num_params(self.layout),):
            raise ValueError(f"flat buffer has shape {flat.shape}, layout needs "
                             f"({num_params(self.layout)},)")
        self.flat = flat
        self.params = views(flat, self.layout)
        self.grad_flat = xp.zeros_like(flat)
        self.grads = views(self.grad_flat, self.layout)
        self.pe = xp.asarray(sinusoidal_positions(cfg.max_seq_len, cfg.d_model), dtype=self.dtype)
        self.lambda_bce = 1.0
        self.lambda_ce = 0.5
        self.ewc = None  # an optim.EWC, when the anti-forgetting term is on
        self._twins: list[Model] = []  # see twins()

    # --- construction --------------------------------------------------------------------
    @classmethod
    def init(cls, cfg: ModelConfig, seed: int = 0, backend: str = "numpy",
             dtype: str = "float32") -> Model:
        """Fresh weights, deterministic by seed (same values for float32 and float64)."""
        ops = get_ops(backend)
        flat = ops.xp.asarray(init_flat(param_layout(cfg), seed, cfg.wide_pair_init,
                                        cfg.wide_pair_init_shared,
                                        cfg.pair_destination_rows), dtype=dtype)
        return cls(cfg, flat, ops, dtype)

    @classmethod
    def from_flat(cls, cfg: ModelConfig, flat, backend: str = "numpy",
                  dtype: str = "float32") -> Model:
        """A model over a COPY of `flat` (serving snapshots never alias training weights)."""
        ops = get_ops(backend)
        return cls(cfg, ops.xp.array(flat, dtype=dtype, copy=True), ops, dtype)

    @property
    def num_params(self) -> int:
        return int(self.flat.size)

    @property
    def deep_size(self) -> int:
        """Parameters AdamW steps: everything before the wide path (its slots come last),
        which has its own optimiser (engine/wide.py)."""
        return self.num_params - sum(int(np.prod(shape)) for name, shape in self.layout
                                     if name.startswith("wide."))

    def wide_logit(self, sources: dict[str, Any]) -> np.ndarray:
        """The wide path's share of the gate logit for a `source_batch`, on the host in
        float64 (zeros when the model has no wide path)."""
        n = np.asarray(sources["src"]).shape[0]
        if "wide_idx" not in sources or "wide.w" not in self.params:
            return np.zeros(n)
        P, xp = self.params, self.ops.xp

        def take(name: str, idx) -> np.ndarray:  # only the touched rows leave the device
            return self.ops.to_numpy(wide_table(P, name)[xp.asarray(idx)]).astype(np.float64)
        keys = wide_feature_keys(sources, "wide.pair_call" in P)
        return wide_logit_host(take, {k: np.asarray(self.ops.to_numpy(sources[k]))
                                      for k in keys}, self.cfg.wide_scale,
                               self.cfg.wide_pair_pool, self.cfg.wide_pair_veto,
                               self.cfg.wide_pair_block_only, member_offsets(self.cfg),
                               familiarity_of(self.cfg))

    def decay_mask(self) -> np.ndarray:
        return decay_mask(self.layout)

    # --- forward pieces -------------------------------------------------------------------
    def _embed(self, tokens, seg=None):
        """x = E[tok] + PE[pos] (+ S[seg] for the source: call or history)."""
        x = self.params["tok_emb"][tokens] + self.pe[: tokens.shape[1]]
        if seg is not None:
            x += self.params["seg_emb"][seg]
        return x

    def _src_masks(self, src, seg):
        """(attention keep [B,1,1,S], call mask [B,S], history mask [B,S]) of a source."""
        keep = src != PAD
        call = keep & (seg == 0)
        return (keep[:, None, None, :], call.astype(self.dtype),
                (keep & ~call).astype(self.dtype))

    def encode(self, src, seg, keep_cache: bool = False):
        """enc = LN_enc(encoder layers(E[src] + PE + S[seg])); returns (enc, caches)."""
        cfg, ops, P = self.cfg, self.ops, self.params
        keep = self._src_masks(src, seg)[0]
        x = self._embed(src, seg)
        caches = []
        for i in range(cfg.n_enc_layers):
            x, c = L.enc_layer_fwd(ops, P, i, x, keep, cfg.n_heads, cfg.ln_eps)
            caches.append(c)
        enc, ln_c = L.ln_fwd(ops, P, "enc.ln", x, cfg.ln_eps)
        return enc, (caches, ln_c) if keep_cache else None

    def gate_logit(self, enc, call_mask, hist_mask, wide=None):
        """z = [pool(call), pool(history)] @ gate.w.T + gate.b (+ the wide logit);
        returns (z, pooled, pool denominators, per member of the wide path (None without
        one) the values its linear logit read and its pair term's sides or None).

        Each pool is a masked mean over its segment (an empty history pools to zeros).
        The wide logit is wide_scale * `veto_combine`(sum_k val_k w[idx_k] over hashed
        n-grams and the structured features, the call x history pair term `pair_logit`):
        their sum, or with `wide_pair_veto` the history as a veto; with
        `wide_pair_block_only` the pair term bounded to speak only for "block"; with
        `wide_familiarity` the n-grams' values read by `familiar_values`, with
        `wide_novel_destinations` the first-seen mark by `novel_values`."""
        ops, xp, P = self.ops, self.ops.xp, self.params
        p_call, d_call = ops.mean_pool(enc, call_mask)
        p_hist, d_hist = ops.mean_pool(enc, hist_mask)
        pooled = xp.concatenate([p_call, p_hist], axis=1)
        z = L.linear_fwd(pooled, P["gate.w"], P["gate.b"])[:, 0]
        sides = None
        if wide is not None:
            # the mean of the bag's members' logits (`ModelConfig.wide_members`; one member:
            # the path's own logit), each member's tables at its offsets
            w_all, z_wide, sides = wide_table(P, "wide.w"), 0.0, []
            for o_w, o_c, o_h in member_offsets(self.cfg):
                w_m, pair = w_all[shifted(wide["wide_idx"], o_w)], None
                # the n-grams read by their familiarity, the first-seen mark by the domain
                val = read_values(w_m, wide["wide_val"], wide, familiarity_of(self.cfg), xp)
                z_m = (w_m * val).sum(axis=1)
                if PAIR_KEYS[0] in wide:
                    c_idx, c_val, h_idx, h_val, h_grp = (wide[k] for k in PAIR_KEYS)
                    z_pair, u, v_eff, hw = pair_logit(
                        P["wide.pair_call"][shifted(c_idx, o_c)], c_val,
                        P["wide.pair_hist"][shifted(h_idx, o_h)], h_val,
                        self.cfg.wide_pair_pool, xp, h_grp)
                    z_m, d_lin, d_pair = veto_combine(z_m, z_pair, self.cfg.wide_pair_veto,
                                                      xp, self.cfg.wide_pair_block_only)
                    pair = (u, v_eff, hw, d_lin, d_pair)
                sides.append((val, pair))
                z_wide = z_wide + z_m
            z = z + self.cfg.wide_scale * z_wide / self.cfg.wide_members
        return z, pooled, (d_call, d_hist), sides

    def decode_logits(self, tgt_in, enc, src_keep):
        """Decoder stack over tgt_in given enc; returns (logits [B,T,V], caches)."""
        cfg, ops, P, xp = self.cfg, self.ops, self.params, self.ops.xp
        t = tgt_in.shape[1]
        causal = xp.tril(xp.ones((t, t), dtype=bool))[None, None]
        y = self._embed(tgt_in)
        caches = []
        for i in range(cfg.n_dec_layers):
            y, c = L.dec_layer_fwd(ops, P, i, y, enc, causal, src_keep, cfg.n_heads, cfg.ln_eps)
            caches.append(c)
        dec, ln_c = L.ln_fwd(ops, P, "dec.ln", y, cfg.ln_eps)
        logits = L.linear_fwd(dec, P["out.w"], P["out.b"])
        return logits, (caches, ln_c, dec)

    def _sources(self, batch: dict[str, Any]):
        """(src, seg, wide) on the backend; seg defaults to all-call and the wide features
        to none, for callers that built `src` by hand."""
        xp = self.ops.xp
        src = xp.asarray(batch["src"])
        seg = xp.asarray(batch["seg"]) if "seg" in batch else xp.zeros_like(src)
        return src, seg, self._wide_inputs(batch)

    def _wide_inputs(self, batch: dict[str, Any]) -> dict | None:
        """The wide path's features of a batch on the backend (bucket ids, the history
        keys' entry numbers and where features sit in rows as integers, values in the
        model's dtype), or None when the model or the batch has none."""
        if "wide_idx" not in batch or "wide.w" not in self.params:
            return None
        keys = wide_feature_keys(batch, "wide.pair_call" in self.params)
        xp = self.ops.xp
        return {k: xp.asarray(batch[k]) if k.endswith(("_idx", "_grp", "_end", "_at")) else
                xp.asarray(batch[k], dtype=self.dtype) for k in keys}

    # --- loss, forward and backward ------------------------------------------------------
    def loss(self, batch: dict[str, Any]) -> tuple[float, dict[str, float]]:
        """Forward only: total loss and its parts {"bce", "ce"} (plus "ewc" when on)."""
        loss, parts, _ = self._forward(batch, need_grads=False)
        return loss, parts

    def loss_and_grads(self, batch: dict[str, Any]) -> tuple[float, dict]:
        """Forward + exact backward; gradients land in `self.grad_flat` (views: returned)."""
        loss, _, _ = self._forward(batch, need_grads=True)
        return loss, self.grads

    def loss_parts_and_grads(self, batch: dict[str, Any], chunk_rows: int | None = None,
                             between_chunks: Callable[[], None] | None = None,
                             cores: ChunkCores | None = None
                             ) -> tuple[float, dict[str, float]]:
        """Like loss_and_grads but returns the loss parts (for metrics); grads in grad_flat.

        With `chunk_rows`, a larger batch is cut into chunks of rows of similar source
        length, each padded only to its own longest source and reason, and the chunks'
        gradients add up in grad_flat. Each chunk's BCE is weighted by its share of the rows
        and its CE divided by the WHOLE batch's target-token count, so the loss and the
        gradient are the whole batch's (exact, up to float rounding), with less work spent
        on PAD: a batch padded to its longest source pays for its longest row 16 times.

        `between_chunks` is called after each chunk: the trainer's turn to let the wide path
        learn the signals that arrived meanwhile (daemon/trainer/loop.py). It must not
        touch the transformer's weights; the wide weights it changes are an input of the
        later chunks' logits, not a parameter this gradient is taken for.

        `cores` (NumPy only; a GPU step keeps its one stream): the chunks run in rounds of
        `cores.width` at once, the first of each round into this model's gradient, the
        others into twins' (`twins`: the same weights, their own gradient buffers), added
        into grad_flat at the end. The same loss and gradient up to float rounding (the
        sums are grouped by core, in a fixed order: no run-to-run difference);
        `between_chunks` is called after each ROUND, when no chunk is running."""
        b = len(batch["label"])  # a list, or an array on the host or the device
        if not chunk_rows or b <= chunk_rows:
            loss, parts, _ = self._forward(batch, need_grads=True)
            return loss, parts
        host = {k: np.asarray(self.ops.to_numpy(v)) for k, v in batch.items()}
        n_targets = int(np.count_nonzero(host["tgt_out"] != PAD))
        chunks = list(length_chunks(host, chunk_rows))
        width = 1 if cores is None or self.ops.xp is not np else min(cores.width, len(chunks))
        models = [self, *self.twins(width - 1)]
        total, parts = 0.0, {}
        for start in range(0, len(chunks), width):
            round_ = chunks[start: start + width]  # the last round may be short
            jobs = [partial(model._forward, part, need_grads=True, share=rows.size / b,
                            ce_count=n_targets, accumulate=start > 0,
                            with_ewc=start == 0 and model is self)
                    for model, (rows, part) in zip(models, round_, strict=False)]
            for loss, chunk_parts, _ in cores.run(jobs) if len(jobs) > 1 else [jobs[0]()]:
                total += loss
                for k, v in chunk_parts.items():
                    parts[k] = parts.get(k, 0.0) + v
            if between_chunks is not None:
                between_chunks()
        if width > 1:  # the twins' sums into grad_flat, a slice per core
            edges = np.linspace(0, self.grad_flat.size, width + 1).astype(int)
            cores.run([partial(_add_twins, self.grad_flat[lo:hi],
                               [t.grad_flat[lo:hi] for t in models[1:]])
                       for lo, hi in zip(edges[:-1], edges[1:], strict=True)])
        return total, parts

    def twins(self, n: int) -> list[Model]:
        """`n` models over the SAME weights (`flat`), each with its own gradient buffer:
        where another core's chunks of a step accumulate (loss_parts_and_grads). Kept
        across steps; made again if `flat` was replaced."""
        kept = [t for t in self._twins if t.flat is self.flat]
        while len(kept) < n:
            kept.append(Model(self.cfg, self.flat, type(self.ops)(), self.dtype.name))
        self._twins = kept
        for twin in kept:
            twin.lambda_bce, twin.lambda_ce = self.lambda_bce, self.lambda_ce
        return kept[:n]

    def _forward(self, batch, need_grads: bool, share: float = 1.0,
                 ce_count: int | None = None, accumulate: bool = False,
                 with_ewc: bool = True):
        """Loss (and, with need_grads, gradients into grad_flat) of `batch`, which is the
        fraction `share` of a larger batch whose CE counts `ce_count` target tokens (see
        loss_parts_and_grads); `accumulate` adds to grad_flat instead of overwriting it."""
        cfg, ops, P, G, xp = self.cfg, self.ops, self.params, self.grads, self.ops.xp
        src, seg, wide = self._sources(batch)
        tgt_in, tgt_out = xp.asarray(batch["tgt_in"]), xp.asarray(batch["tgt_out"])
        label = xp.asarray(batch["label"], dtype=self.dtype)
        weight = xp.asarray(batch["weight"], dtype=self.dtype)
        b = src.shape[0]
        src_keep, call_mask, hist_mask = self._src_masks(src, seg)

        enc, enc_cache = self.encode(src, seg, keep_cache=need_grads)
        z, pooled, denoms, sides = self.gate_logit(enc, call_mask, hist_mask, wide)
        bce, dz = ops.bce_with_logits(z, label, weight, self.lambda_bce * share)
        bce *= share

        tgt_mask = (tgt_out != PAD).astype(self.dtype).reshape(-1)
        # Counted on the host copy of the batch: on a GPU, reading a device sum back here
        # would stall the queue in the middle of the forward pass.
        n_targets = int(np.count_nonzero(self.ops.to_numpy(batch["tgt_out"]) != PAD))
        has_targets = n_targets > 0
        ce, dlogits = 0.0, None
        if has_targets:
            # Without target tokens the decoder adds nothing to the loss or any gradient,
            # so it is skipped exactly (not approximated).
            logits, dec_cache = self.decode_logits(tgt_in, enc, src_keep)
            targets = xp.where(tgt_out == PAD, 0, tgt_out).reshape(-1)
            ce, dlogits, _ = ops.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets,
                                               tgt_mask, self.lambda_ce,
                                               count=n_targets if ce_count is None else ce_count)
        parts = {"bce": bce, "ce": ce}
        total = self.lambda_bce * bce + self.lambda_ce * ce
        ewc_on = with_ewc and self.ewc is not None and self.ewc.lam > 0
        if ewc_on:
            parts["ewc"] = self.ewc.penalty(self.flat)
            total += parts["ewc"]
        if not need_grads:
            return total, parts, None

        if not accumulate:
            self.grad_flat[...] = 0
        # Wide path: dL/dw[idx_k] += wide_scale * dz * d_lin * val_k (a scatter-add, exact);
        # the pair term: dL/dU[c_k] += wide_scale * dz * d_pair * cv_k * v_eff, dL/dV[h_k]
        # += wide_scale * dz * d_pair * hw_k * u (`pair_logit`: with a sum, v_eff = v and hw =
        # the keys' values; `veto_combine`: d_lin = d_pair = 1 for the sum).
        # Each member of the bag gets its share, dz / wide_members, at its offsets.
        if wide is not None:
            for m, (o_w, o_c, o_h) in enumerate(member_offsets(cfg)):
                dzs = cfg.wide_scale * dz / cfg.wide_members
                val, pair = sides[m]  # the values as read (`read_values`), the pair term's
                if pair is not None:
                    u, v_eff, hw, d_lin, d_pair = pair
                    dzp = dzs * d_pair
                    for name, side, coef, other, off in (
                            ("wide.pair_call", "pc", wide["wide_pc_val"], v_eff, o_c),
                            ("wide.pair_hist", "ph", hw, u, o_h)):
                        ops.embedding_bwd(G[name], shifted(wide[f"wide_{side}_idx"], off),
                                          (dzp[:, None] * coef)[:, :, None] * other[:, None, :])
                    dzs = dzs * d_lin
                ops.embedding_bwd(G["wide.w"].reshape(-1, 1), shifted(wide["wide_idx"], o_w),
                                  (dzs[:, None] * val)[:, :, None])
        # Gate head and the two mean-pools -> d enc.
        d = cfg.d_model
        dpooled = L.linear_bwd(ops, dz[:, None], pooled, P["gate.w"], G["gate.w"], G["gate.b"])
        denc = ops.mean_pool_bwd(xp.ascontiguousarray(dpooled[:, :d]), call_mask, denoms[0])
        denc += ops.mean_pool_bwd(xp.ascontiguousarray(dpooled[:, d:]), hist_mask, denoms[1])
        if has_targets:
            dec_caches, dec_ln, dec = dec_cache
            ddec = L.linear_bwd(ops, dlogits.reshape(b, -1, cfg.vocab_size), dec, P["out.w"],
                                G["out.w"], G["out.b"])
            dy = L.ln_bwd(ops, P, G, "dec.ln", ddec, dec_ln)
            for i in reversed(range(cfg.n_dec_layers)):
                dy, denc_i = L.dec_layer_bwd(ops, P, G, i, dy, dec_caches[i], cfg.n_heads)
                denc = denc + denc_i
            ops.embedding_bwd(G["tok_emb"], tgt_in, dy)
        enc_caches, enc_ln = enc_cache
        dx = L.ln_bwd(ops, P, G, "enc.ln", denc, enc_ln)
        for i in reversed(range(cfg.n_enc_layers)):
            dx = L.enc_layer_bwd(ops, P, G, i, dx, enc_caches[i], cfg.n_heads)
        ops.embedding_bwd(G["tok_emb"], src, dx)
        ops.embedding_bwd(G["seg_emb"], seg, dx)
        if ewc_on:
            self.ewc.add_grad(self.flat, self.grad_flat)
        return total, parts, None

    def reserve(self, batch_size: int, src_len: int | None = None,
                tgt_len: int | None = None) -> None:
        """One forward + backward on a batch of the largest shape the config allows, then
        the gradient is zeroed again; the weights are not touched.

        On the GPU this makes the memory pool hold every buffer a step of that size needs,
        so the steady state allocates nothing new from the device (smaller batches reuse
        the blocks), and a configuration that does not fit fails here, at start-up, with
        an out-of-memory error, instead of at the first long batch.
        """
        s = src_len or self.cfg.max_seq_len
        t = tgt_len or self.cfg.max_seq_len
        tok = np.full((batch_size, max(s, t)), ord("a"), dtype=np.int64)
        seg = np.zeros((batch_size, s), dtype=np.int64)
        seg[:, s // 2:] = 1
        k = 2 * self.cfg.wide_ngram * s  # at most this many n-gram features per source
        batch = {"src": tok[:, :s], "seg": seg, "tgt_in": tok[:, :t].copy(),
                 "tgt_out": tok[:, :t], "label": np.ones(batch_size),
                 "weight": np.ones(batch_size), "wide_idx": np.zeros((batch_size, k), np.int64),
                 "wide_val": np.zeros((batch_size, k))}
        for side in ("pc", "ph"):  # the pair term's sides: at most MAX_STRUCTURED keys each
            batch[f"wide_{side}_idx"] = np.zeros((batch_size, MAX_STRUCTURED), np.int64)
            batch[f"wide_{side}_val"] = np.zeros((batch_size, MAX_STRUCTURED))
        batch["wide_ph_grp"] = np.zeros((batch_size, MAX_STRUCTURED), np.int64)
        batch["tgt_in"][:, 0] = BOS
        ewc, self.ewc = self.ewc, None
        try:
            self.loss_and_grads(batch)
        finally:
            self.ewc = ewc
            self.grad_flat[...] = 0

    # --- serving -----------------------------------------------------------------------------
    def predict_logits(self, sources: dict[str, Any]):
        """Gate logits z for a `source_batch` (encoder and wide path only), on the backend."""
        src, seg, wide = self._sources(sources)
        enc, _ = self.encode(src, seg)
        _, call_mask, hist_mask = self._src_masks(src, seg)
        return self.gate_logit(enc, call_mask, hist_mask, wide)[0]

    def predict_z(self, sources: dict[str, Any], chunk: int = 16) -> np.ndarray:
        """Gate logits as float64 host values (calibration works on logits), scored in
        length-sorted chunks of `chunk` rows (`length_chunks`: same values, less PAD)."""
        host = {k: np.asarray(self.ops.to_numpy(v)) for k, v in sources.items()}
        out = np.empty(host["src"].shape[0], dtype=np.float64)
        for rows, part in length_chunks(host, chunk):
            out[rows] = self.ops.to_numpy(self.predict_logits(part)).astype(np.float64)
        return out

    def predict_proba(self, sources: dict[str, Any]) -> np.ndarray:
        """p_allow = sigmoid(gate logit) for a `source_batch` (uncalibrated)."""
        return self.ops.to_numpy(self.ops.sigmoid(self.predict_logits(sources))).astype(
            np.float64)

    def predict_and_decode(self, sources: dict[str, Any], max_len: int = 64) -> tuple[float, str]:
        """(p_allow, greedy-decoded reason) for a one-row `source_batch`, sharing the
        encoder pass."""
        xp = self.ops.xp
        src, seg, wide = self._sources(sources)
        enc, _ = self.encode(src, seg)
        keep, call_mask, hist_mask = self._src_masks(src, seg)
        z = self.gate_logit(enc, call_mask, hist_mask, wide)[0]
        p = float(self.ops.to_numpy(self.ops.sigmoid(z))[0])
        tokens = [BOS]
        for _ in range(min(max_len, self.cfg.max_seq_len)):
            logits, _ = self.decode_logits(xp.asarray([tokens]), enc, keep)
            nxt = int(self.ops.to_numpy(logits[0, -1].argmax()))
            if nxt == EOS:
                break
            tokens.append(nxt)
        return p, decode_bytes(tokens[1:])

    def greedy_decode(self, sources: dict[str, Any], max_len: int = 64) -> str:
        """The reason the decoder produces for a one-row source, greedily."""
        return self.predict_and_decode(sources, max_len)[1]
