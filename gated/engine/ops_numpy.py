"""The backend seam: the fused operations of a training step, on NumPy.

Model code is written against `ops.xp` (the array namespace) plus the methods below.
A GPU backend subclasses `NumpyOps`, sets `xp = cupy` and replaces methods with fused
kernels; everything else (matmuls, reshapes) already runs on `xp`.
"""

from __future__ import annotations

import math

import numpy as np

GELU_C = math.sqrt(2.0 / math.pi)
#: An embedding table of at most this many rows takes its gradient as one GEMM (the
#: one-hot matrix of the tokens, transposed, times dx); the wide path's hashed tables,
#: far larger, keep the scatter-add.
ONE_HOT_ROWS = 4096
#: Elements per block of the whole-buffer passes (AdamW, the gradient norm): a block's
#: five float32 arrays (~1.3 MiB) stay in a core's L2 across the update's ten passes,
#: where whole 5M-element buffers stream from memory on each.
FLAT_BLOCK = 1 << 16


def gelu_tanh(a):
    """t = tanh(c (a + 0.044715 a^3)), the inner term of tanh-GELU, as a new array (the
    forward keeps it for the backward pass; serving turns it into the output in place)."""
    t = a * a
    t *= 0.044715
    t += 1.0
    t *= a
    t *= GELU_C
    np.tanh(t, out=t)
    return t


def clip_scale(norm: float, clip: float | None) -> float:
    """The factor that clips a gradient of global L2 norm `norm` to `clip` (PyTorch's
    clip_grad_norm_ formula; None or 0 disables). kernels.cu's adamw forms it alike."""
    return clip / (norm + 1e-6) if clip and norm > clip else 1.0


def stats_finite(stats) -> bool:
    """Whether a step's stats (`step_stats`: the two squared gradient norms and the loss,
    host values) allow its update; kernels.cu's adamw applies the same rule on the device."""
    return all(math.isfinite(float(x)) for x in stats[:3])


class NumpyOps:
    """Reference implementations: exact, readable, vectorised."""

    name = "numpy"
    xp = np

    def asarray(self, a, dtype=None):
        return self.xp.asarray(a, dtype=dtype)

    def to_numpy(self, a) -> np.ndarray:
        return np.asarray(a)

    # --- Linear layer: its parameters' gradients ---------------------------------------
    def linear_param_grads(self, dy2, x2, dw, db):
        """dW += dy2^T x2 and db += the column sums of dy2 (dy2 [rows, out], x2 [rows, in])."""
        dw += dy2.T @ x2
        db += dy2.sum(axis=0)

    # --- LayerNorm ------------------------------------------------------------------
    def layernorm_fwd(self, x, g, b, eps: float):
        """y = (x - mean) / sqrt(var + eps) * g + b, biased variance over the last axis."""
        mean = x.mean(axis=-1, keepdims=True)
        xc = x - mean
        var = (xc * xc).mean(axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(var + eps)
        xhat = xc * rstd
        return xhat * g + b, (xhat, rstd)

    def layernorm_bwd(self, dy, cache, g, dg, db):
        """dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)); accumulates dg, db."""
        xhat, rstd = cache
        d = xhat.shape[-1]
        dg += (dy * xhat).reshape(-1, d).sum(axis=0)
        db += dy.reshape(-1, d).sum(axis=0)
        dxhat = dy * g
        return rstd * (
            dxhat
            - dxhat.mean(axis=-1, keepdims=True)
            - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
        )

    # --- bias + tanh-GELU ------------------------------------------------------------
    def bias_gelu_fwd(self, h, b):
        """a = h + b; y = 0.5 a (1 + tanh(c (a + 0.044715 a^3))). Returns (y, (a, t)).

        `h` is consumed (a is computed in place); tanh is kept for the backward pass, so
        the most expensive elementwise function runs once per step, not twice.
        """
        a = h
        a += b
        t = gelu_tanh(a)
        y = t + 1.0
        y *= a
        y *= 0.5
        return y, (a, t)

    def gelu_bwd(self, dy, cache):
        """dy * d/da [0.5 a (1 + t)] = dy * (0.5 (1 + t) + 0.5 a (1 - t^2) c (1 + 3k a^2))."""
        a, t = cache
        inner = a * a
        inner *= 3 * 0.044715
        inner += 1.0
        inner *= GELU_C
        inner *= a
        sech2 = t * t
        np.subtract(1.0, sech2, out=sech2)
        sech2 *= inner
        sech2 += t
        sech2 += 1.0
        sech2 *= 0.5
        sech2 *= dy
        return sech2

    # --- attention softmax -----------------------------------------------------------
    def masked_softmax(self, s, keep, scale: float):
        """Row softmax of `s * scale` [.., Tq, Tk] where `keep` (broadcastable bool) is True.

        Masked scores are -inf before the softmax, so they get exactly zero probability.
        `s` is consumed (scaled in place).
        """
        s *= scale
        p = np.where(keep, s, -np.inf)  # the one new buffer; the rest runs in place
        p -= p.max(axis=-1, keepdims=True)
        np.exp(p, out=p)
        p /= p.sum(axis=-1, keepdims=True)
        return p

    def softmax_bwd(self, p, dp, scale: float):
        """dS = scale * P * (dP - rowsum(P * dP)) (the scores were s * scale)."""
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
        ds *= scale
        return ds

    # --- losses ----------------------------------------------------------------------
    def cross_entropy(self, logits, targets, mask, scale: float, count: float | None = None):
        """Masked token-mean CE and its gradient (already multiplied by `scale`).

        logits [N, V], targets [N] int, mask [N] float (0/1). Returns (loss, dlogits, count).
        `count` = mask.sum() when the caller already knows it (saves a GPU read-back).
        """
        count = float(mask.sum()) if count is None else float(count)
        denom = max(1.0, count)
        m = logits.max(axis=-1, keepdims=True)
        e = np.exp(logits - m)
        z = e.sum(axis=-1, keepdims=True)
        lse = (np.log(z) + m)[:, 0]
        picked = np.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
        loss = float(((lse - picked) * mask).sum() / denom)
        dlogits = e / z
        dlogits[np.arange(targets.shape[0]), targets] -= 1.0
        dlogits *= (mask * (scale / denom))[:, None]
        return loss, dlogits, count

    def bce_with_logits(self, z, y, w, scale: float):
        """Weighted BCE, stable form; returns (loss, dz * scale)."""
        n = z.shape[0]
        l = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
        loss = float((w * l).sum() / n)
        dz = w * (self.sigmoid(z) - y) * (scale / n)
        return loss, dz

    def sigmoid(self, z):
        # Split by sign so exp never overflows. On `self.xp`: the kernel backends use it too.
        xp = self.xp
        e = xp.exp(-xp.abs(z))
        return xp.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))

    # --- embedding and pooling -------------------------------------------------------
    def embedding_bwd(self, d_emb, tokens, dx):
        """Scatter-add rows of dx [B, T, d] into d_emb [V, d] at `tokens` [B, T].

        For a small table (the byte vocabulary, the two segments) the sum is one GEMM,
        d_emb += onehot(tokens)^T dx: the same sums in another order, ~4x faster than
        np.add.at's row-by-row loop; a large table (`ONE_HOT_ROWS`) is scatter-added."""
        rows, d2 = tokens.reshape(-1), dx.reshape(-1, dx.shape[-1])
        if d_emb.shape[0] > ONE_HOT_ROWS:
            np.add.at(d_emb, rows, d2)
            return
        onehot = np.zeros((d_emb.shape[0], rows.size), dtype=d2.dtype)
        onehot[rows, np.arange(rows.size)] = 1.0
        d_emb += onehot @ d2

    def mean_pool(self, x, mask):
        """sum_t m_t x_t / max(1, sum_t m_t) over [B, S, d] with mask [B, S] float.

        A row with an empty mask (a call without history) pools to zeros, gradient 0."""
        denom = self.xp.maximum(mask.sum(axis=1, keepdims=True), 1.0)
        return (x * mask[:, :, None]).sum(axis=1) / denom, denom

    def mean_pool_bwd(self, dpooled, mask, denom):
        return (dpooled / denom)[:, None, :] * mask[:, :, None]

    # --- optimiser -------------------------------------------------------------------
    def sq_norm(self, flat) -> float:
        """Sum of squares in float64 (the global gradient norm is sqrt of this), block by
        block: no float64 copy of the whole buffer (43 MB for flint) is made."""
        total = 0.0
        for lo in range(0, flat.size, FLAT_BLOCK):
            f = flat[lo: lo + FLAT_BLOCK].astype(np.float64, copy=False)
            total += float(np.dot(f, f))
        return total

    def step_stats(self, grad_flat, n_clipped: int, values) -> np.ndarray:
        """float64 [sq norm of grad[:n_clipped], sq norm of grad[n_clipped:], *values]:
        what AdamW's update reads (the clip norm, the finite check; values[0] is the loss)
        and what the host reads back once, after the step. On the GPU it stays there."""
        return np.array([self.sq_norm(grad_flat[:n_clipped]), self.sq_norm(grad_flat[n_clipped:]),
                         *(float(x) for x in values)], dtype=np.float64)

    def adamw(self, p, g, m, v, decay, *, lr, b1, b2, eps, wd, step, stats, clip):
        """One AdamW step in PyTorch's order, in place on flat buffers:

            p -= lr wd decay p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
            p -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)

        g is multiplied by `clip_scale(sqrt(stats[0]), clip)` first (global-norm clipping
        folded in); nothing at all happens unless stats[0:3] (`step_stats`: the squared
        norms and the loss) are finite. One scratch buffer, reused across steps, keeps the
        update free of per-step allocations.
        """
        if not stats_finite(stats):
            return
        grad_scale = clip_scale(math.sqrt(float(stats[0])), clip)
        bc1 = 1.0 - b1**step
        bc2 = 1.0 - b2**step
        scratch = self._scratch(p[:FLAT_BLOCK])
        # Block by block (`FLAT_BLOCK`): each element sees the same operations as on the
        # whole buffer, so the result is the same to the bit, with the block in cache.
        for lo in range(0, p.size, FLAT_BLOCK):
            hi = min(p.size, lo + FLAT_BLOCK)
            pb, gb, mb, vb, tmp = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], scratch[: hi - lo]
            if wd:
                np.multiply(pb, decay[lo:hi], out=tmp)
                tmp *= lr * wd
                pb -= tmp
            np.multiply(gb, (1.0 - b1) * grad_scale, out=tmp)
            mb *= b1
            mb += tmp
            np.multiply(gb, gb, out=tmp)
            tmp *= (1.0 - b2) * grad_scale * grad_scale
            vb *= b2
            vb += tmp
            np.divide(vb, bc2, out=tmp)
            np.sqrt(tmp, out=tmp)
            tmp += eps
            np.divide(mb, tmp, out=tmp)
            tmp *= lr / bc1
            pb -= tmp

    def _scratch(self, like):
        buf = getattr(self, "_scratch_buf", None)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = self._scratch_buf = self.xp.empty_like(like)
        return buf

    def all_finite(self, a) -> bool:
        return bool(self.xp.isfinite(a).all())
