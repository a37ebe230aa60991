"""Softmax attention for a batch of queries, written as a map over queries of a fold with the logwsum monoid.

out_i = sum_j softmax_j(q_i . k_j / sqrt(F)) v_j is the v-field of the logwsum fold of {z: scores_ij, v: v_j}
(the online-softmax recurrence). Small and materialised here (the scores of one query at a time); the
memory-efficient version over a matrix product is gemm_map_reduce. Both gradients — the generic reduce rule
and the Theorem 2.1 shortcut — are computed and compared with the naive NumPy formula's gradient.
"""

from __future__ import annotations

import numpy as np

import fold


def attention(Q, K, V):
    scale = 1.0 / np.sqrt(Q.shape[1])

    def one_query(q):
        scores = fold.map(lambda k: fold.reduce(fold.monoids.sum, q * k) * scale, K)
        return fold.reduce(fold.monoids.logwsum, {"z": scores, "v": V})["v"]

    return fold.map(one_query, Q)


def attention_numpy(Q, K, V):
    s = Q @ K.T / np.sqrt(Q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p @ V


def attention_numpy_vjp(Q, K, V, G):
    """The hand-written backward of the naive formula, for reference."""
    scale = 1.0 / np.sqrt(Q.shape[1])
    s = Q @ K.T * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dV = p.T @ G
    dp = G @ V.T
    ds = p * (dp - (dp * p).sum(axis=1, keepdims=True))
    return ds @ K * scale, ds.T @ Q * scale, dV


def main(m: int = 6, n: int = 10, f: int = 4, d: int = 3, verbose: bool = True) -> dict:
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(m, f)), rng.normal(size=(n, f)), rng.normal(size=(n, d))
    G = rng.normal(size=(m, d))
    out = fold.run(attention, Q, K, V)
    reference = attention_numpy_vjp(Q, K, V, G)
    grads = {rule: fold.vjp(attention, Q, K, V, reduce_rule=rule)[1](G) for rule in ("generic", "monoid")}
    errors = {
        "forward": float(np.max(np.abs(out - attention_numpy(Q, K, V)))),
        **{f"{rule} vs naive": max(float(np.max(np.abs(a - b))) for a, b in zip(g, reference, strict=True)) for rule, g in grads.items()},
        "generic vs monoid": max(float(np.max(np.abs(a - b))) for a, b in zip(grads["generic"], grads["monoid"], strict=True)),
    }
    if verbose:
        print(f"attention, {m} queries, {n} keys: largest differences")
        for name, err in errors.items():
            print(f"  {name:<20} {err:.2e}")
        print(fold.compare_rules(attention, (Q, K, V), G))
    return errors


if __name__ == "__main__":
    main()
