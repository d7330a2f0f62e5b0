"""Forward and backward of every layer, side by side.

Each `*_fwd` returns its output and a cache of exactly what its `*_bwd` needs; each
`*_bwd` takes the upstream gradient, ACCUMULATES parameter gradients into the views of
the flat gradient buffer (`G[name] += ...`) and returns the gradient of its input(s).
`P` and `G` are the name -> view dicts of the parameter and gradient buffers; `ops` is
the backend (see ops_numpy.py). Shapes: B batch, S source, T target, d model width.
"""

from __future__ import annotations

import math

# --- Linear: y = x @ W.T + b -----------------------------------------------------------


def matmul_wt(x, w):
    """x @ W.T over the last axis, as ONE 2-D GEMM (a stacked 3-D matmul is ~30% slower)."""
    return (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])


def linear_fwd(x, w, b):
    y = matmul_wt(x, w)
    y += b
    return y


def linear_bwd(ops, dy, x, w, dw, db):
    """dW += dy^T x, db += sum dy, returns dx = dy W (over flattened leading axes).

    The two accumulations are one backend call: on the GPU the GEMM adds into dW itself
    (cuBLAS beta = 1, no temporary) and the column sums are one kernel."""
    d_out, d_in = w.shape
    dy2 = dy.reshape(-1, d_out)
    ops.linear_param_grads(dy2, x.reshape(-1, d_in), dw, db)
    return (dy2 @ w).reshape(*dy.shape[:-1], d_in)


# --- LayerNorm -------------------------------------------------------------------------


def ln_fwd(ops, P, name, x, eps):
    return ops.layernorm_fwd(x, P[f"{name}.g"], P[f"{name}.b"], eps)


def ln_bwd(ops, P, G, name, dy, cache):
    return ops.layernorm_bwd(dy, cache, P[f"{name}.g"], G[f"{name}.g"], G[f"{name}.b"])


# --- Multi-head attention ----------------------------------------------------------------


def _split_heads(x, n_heads):
    b, t, d = x.shape
    return x.reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def _merge_heads(x):
    b, h, t, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


def attn_fwd(ops, P, name, xq, xkv, keep, n_heads):
    """softmax(Q K^T / sqrt(d_head), masked) V, heads as contiguous slices of d_model.

    `keep` is a bool array broadcastable to [B, H, Tq, Tk]: True where a query may attend.
    `xkv` is xq for self-attention and the encoder output for cross-attention.
    """
    q = _split_heads(linear_fwd(xq, P[f"{name}.wq"], P[f"{name}.bq"]), n_heads)
    k = _split_heads(linear_fwd(xkv, P[f"{name}.wk"], P[f"{name}.bk"]), n_heads)
    v = _split_heads(linear_fwd(xkv, P[f"{name}.wv"], P[f"{name}.bv"]), n_heads)
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = ops.masked_softmax(q @ k.transpose(0, 1, 3, 2), keep, scale)
    o = _merge_heads(p @ v)
    y = linear_fwd(o, P[f"{name}.wo"], P[f"{name}.bo"])
    return y, (xq, xkv, q, k, v, p, o, scale)


def attn_bwd(ops, P, G, name, dy, cache, n_heads):
    """Returns (dxq, dxkv). For self-attention the caller adds the two."""
    xq, xkv, q, k, v, p, o, scale = cache
    do = _split_heads(
        linear_bwd(ops, dy, o, P[f"{name}.wo"], G[f"{name}.wo"], G[f"{name}.bo"]), n_heads)
    dp = do @ v.transpose(0, 1, 3, 2)
    dv = p.transpose(0, 1, 3, 2) @ do
    ds = ops.softmax_bwd(p, dp, scale)
    dq = ds @ k
    dk = ds.transpose(0, 1, 3, 2) @ q

    def back(d, x, w):  # the input projection `w` of q, k or v
        return linear_bwd(ops, _merge_heads(d), x, P[f"{name}.w{w}"], G[f"{name}.w{w}"],
                          G[f"{name}.b{w}"])

    dxq = back(dq, xq, "q")
    dxkv = back(dk, xkv, "k")
    dxkv += back(dv, xkv, "v")
    return dxq, dxkv


# --- Feed-forward: W2 gelu(W1 x + b1) + b2 ---------------------------------------------------


def ffn_fwd(ops, P, name, x):
    h, act = ops.bias_gelu_fwd(matmul_wt(x, P[f"{name}.w1"]), P[f"{name}.b1"])
    y = linear_fwd(h, P[f"{name}.w2"], P[f"{name}.b2"])
    return y, (x, act, h)


def ffn_bwd(ops, P, G, name, dy, cache):
    x, act, h = cache
    dh = linear_bwd(ops, dy, h, P[f"{name}.w2"], G[f"{name}.w2"], G[f"{name}.b2"])
    da = ops.gelu_bwd(dh, act)
    return linear_bwd(ops, da, x, P[f"{name}.w1"], G[f"{name}.w1"], G[f"{name}.b1"])


# --- Encoder layer: h = x + SelfAttn(LN1 x); x' = h + FFN(LN2 h) -----------------------------


def enc_layer_fwd(ops, P, i, x, keep, n_heads, eps):
    n = f"enc.{i}"
    a_in, ln1 = ln_fwd(ops, P, f"{n}.ln1", x, eps)
    a_out, att = attn_fwd(ops, P, f"{n}.attn", a_in, a_in, keep, n_heads)
    h = x + a_out
    f_in, ln2 = ln_fwd(ops, P, f"{n}.ln2", h, eps)
    f_out, ffn = ffn_fwd(ops, P, f"{n}.ffn", f_in)
    return h + f_out, (ln1, att, ln2, ffn)


def enc_layer_bwd(ops, P, G, i, dy, cache, n_heads):
    n = f"enc.{i}"
    ln1, att, ln2, ffn = cache
    dh = dy + ln_bwd(ops, P, G, f"{n}.ln2", ffn_bwd(ops, P, G, f"{n}.ffn", dy, ffn), ln2)
    dq, dkv = attn_bwd(ops, P, G, f"{n}.attn", dh, att, n_heads)
    return dh + ln_bwd(ops, P, G, f"{n}.ln1", dq + dkv, ln1)


# --- Decoder layer: causal self-attn, cross-attn over enc, FFN --------------------------------


def dec_layer_fwd(ops, P, i, x, enc, self_keep, cross_keep, n_heads, eps):
    n = f"dec.{i}"
    s_in, ln1 = ln_fwd(ops, P, f"{n}.ln1", x, eps)
    s_out, sa = attn_fwd(ops, P, f"{n}.self", s_in, s_in, self_keep, n_heads)
    h1 = x + s_out
    c_in, ln2 = ln_fwd(ops, P, f"{n}.ln2", h1, eps)
    c_out, ca = attn_fwd(ops, P, f"{n}.cross", c_in, enc, cross_keep, n_heads)
    h2 = h1 + c_out
    f_in, ln3 = ln_fwd(ops, P, f"{n}.ln3", h2, eps)
    f_out, ffn = ffn_fwd(ops, P, f"{n}.ffn", f_in)
    return h2 + f_out, (ln1, sa, ln2, ca, ln3, ffn)


def dec_layer_bwd(ops, P, G, i, dy, cache, n_heads):
    """Returns (dx, denc): the cross-attention K/V gradient flows back into the encoder."""
    n = f"dec.{i}"
    ln1, sa, ln2, ca, ln3, ffn = cache
    dh2 = dy + ln_bwd(ops, P, G, f"{n}.ln3", ffn_bwd(ops, P, G, f"{n}.ffn", dy, ffn), ln3)
    dcq, denc = attn_bwd(ops, P, G, f"{n}.cross", dh2, ca, n_heads)
    dh1 = dh2 + ln_bwd(ops, P, G, f"{n}.ln2", dcq, ln2)
    dsq, dskv = attn_bwd(ops, P, G, f"{n}.self", dh1, sa, n_heads)
    return dh1 + ln_bwd(ops, P, G, f"{n}.ln1", dsq + dskv, ln1), denc
