"""The layers of Table 1 of the GeMMMapReduce paper, each a few lines on top of fold.gemm_map_reduce,
checked against the naive, materialised NumPy formulas (forward, and the cotangents of every input against
hand-written backward passes). fold's backward needs no code of its own.
"""

from __future__ import annotations

import numpy as np

import fold


def attention(Q, K, V, block=None):
    """softmax(Q K^T / sqrt(F)) V"""
    scale = 1.0 / np.sqrt(Q.shape[1])
    A = fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, v: {"z": s * scale, "v": v}, Q, K, cols=(V,), block=block)
    return A["v"]


def causal_attention(Q, K, V, block=None):
    """attention where query i sees keys j <= i: the mask is part of the map."""
    scale = 1.0 / np.sqrt(Q.shape[1])
    i, j = fold.iota(Q.shape[0]), fold.iota(K.shape[0])
    A = fold.gemm_map_reduce(fold.monoids.logwsum,
                             lambda s, i, v, j: {"z": fold.where(j <= i, s * scale, -np.inf), "v": v},
                             Q, K, rows=(i,), cols=(V, j), block=block)
    return A["v"]


def cross_entropy(P, C, targets, block=None):
    """cross-entropy of the logits P C^T against class indices, per row."""
    j = fold.iota(C.shape[0])
    A = fold.gemm_map_reduce(fold.monoids.cross_entropy, lambda s, t, j: {"p": s, "n": fold.where(j == t, s, 0.0)},
                             P, C, rows=(targets,), cols=(j,), block=block)
    return A["p"] - A["n"]


def distillation(Ps, Cs, Pt, Ct, block=None):
    """cross-entropy of student logits Ps Cs^T against the teacher's distribution softmax(Pt Ct^T), per row."""
    A = fold.gemm_map_reduce(fold.monoids.cross_entropy_dist, lambda q, p: {"q": q, "p": p, "n": q},
                             (Ps, Pt), (Cs, Ct), block=block)
    return A["q"] - A["n"]


def mlp(X, P, Q, block=None):
    """sigmoid(X P) Q, folded over the wide hidden dimension K without materialising the B x K activations."""
    A = fold.gemm_map_reduce(fold.monoids.vsum, lambda s, q: {"v": fold.sigmoid(s) * q}, X, P.T, cols=(Q,), block=block)
    return A["v"]


# ----------------------------------------------------------------- naive references with hand-written backward

def _softmax(s):
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def attention_naive(Q, K, V, G, causal=False):
    scale = 1.0 / np.sqrt(Q.shape[1])
    s = Q @ K.T * scale
    if causal:
        s = np.where(np.arange(K.shape[0])[None, :] <= np.arange(Q.shape[0])[:, None], s, -np.inf)
    p = _softmax(s)
    dp = G @ V.T
    ds = p * (dp - (dp * p).sum(axis=1, keepdims=True)) * scale
    return p @ V, (ds @ K, ds.T @ Q, p.T @ G)


def cross_entropy_naive(P, C, targets, g):
    logits = P @ C.T
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    y = lse - logits[np.arange(len(targets)), targets]
    dlogits = _softmax(logits)
    dlogits[np.arange(len(targets)), targets] -= 1.0
    dlogits *= g[:, None]
    return y, (dlogits @ C, dlogits.T @ P)


def distillation_naive(Ps, Cs, Pt, Ct, g):
    q, p = Ps @ Cs.T, Pt @ Ct.T
    t, sq = _softmax(p), _softmax(q)
    logsq = q - (np.log(np.exp(q - q.max(1, keepdims=True)).sum(1, keepdims=True)) + q.max(1, keepdims=True))
    y = -(t * logsq).sum(1)
    dq = (sq - t) * g[:, None]
    dlogt = -logsq * g[:, None]                          # d y / d t, then through the softmax
    dp = t * (dlogt - (dlogt * t).sum(1, keepdims=True))
    return y, (dq @ Cs, dq.T @ Ps, dp @ Ct, dp.T @ Pt)


def mlp_naive(X, P, Q, G):
    h = 1.0 / (1.0 + np.exp(-(X @ P)))
    dh = (G @ Q.T) * h * (1.0 - h)
    return h @ Q, (dh @ P.T, X.T @ dh, h.T @ G)


def _worst(a, b) -> float:
    return max(float(np.max(np.abs(x - y) / (1.0 + np.abs(y)))) for x, y in zip(a, b, strict=True))


def main(m: int = 24, n: int = 40, f: int = 8, d: int = 5, block=(7, 11), dtype=np.float64, verbose: bool = True) -> dict:
    rng = np.random.default_rng(4)
    r = lambda *shape: rng.normal(size=shape).astype(dtype)  # noqa: E731
    Q, K, V, G = r(m, f), r(n, f), r(n, d), r(m, d)
    errors = {}
    for name, fn, causal, kk, vv in [("attention", attention, False, K, V), ("causal attention", causal_attention, True, K[:m], V[:m])]:
        out = fold.run(lambda Q_, K_, V_: fn(Q_, K_, V_, block), Q, kk, vv)
        ref, ref_grads = attention_naive(Q, kk, vv, G, causal)
        grads = fold.vjp(lambda Q_, K_, V_: fn(Q_, K_, V_, block), Q, kk, vv)[1](G)
        errors[name] = max(_worst([out], [ref]), _worst(grads, ref_grads))
    P, C, targets, g = r(m, f), r(n, f), rng.integers(0, n, m), r(m)
    out = fold.run(lambda P_, C_, t_: cross_entropy(P_, C_, t_, block), P, C, targets)
    ref, ref_grads = cross_entropy_naive(P, C, targets, g)
    grads = fold.vjp(lambda P_, C_: cross_entropy(P_, C_, targets, block), P, C)[1](g)
    errors["cross-entropy"] = max(_worst([out], [ref]), _worst(grads, ref_grads))
    Ps, Cs, Pt, Ct = r(m, f), r(n, f), r(m, d), r(n, d)
    out = fold.run(lambda *a: distillation(*a, block), Ps, Cs, Pt, Ct)
    ref, ref_grads = distillation_naive(Ps, Cs, Pt, Ct, g)
    grads = fold.vjp(lambda *a: distillation(*a, block), Ps, Cs, Pt, Ct)[1](g)
    errors["distillation"] = max(_worst([out], [ref]), _worst(grads, ref_grads))
    X, Pm, Qm, Gm = r(m, f), r(f, n), r(n, d), r(m, d)
    out = fold.run(lambda *a: mlp(*a, block), X, Pm, Qm)
    ref, ref_grads = mlp_naive(X, Pm, Qm, Gm)
    grads = fold.vjp(lambda *a: mlp(*a, block), X, Pm, Qm)[1](Gm)
    errors["mlp"] = max(_worst([out], [ref]), _worst(grads, ref_grads))
    if verbose:
        print(f"Table 1 layers with gemm_map_reduce ({np.dtype(dtype).name}, block {block}): largest relative error "
              "of forward and every cotangent against the naive formulas")
        for name, err in errors.items():
            print(f"  {name:<18} {err:.2e}")
    return errors


if __name__ == "__main__":
    main()
