"""The fold demo: programs traced, printed, run, differentiated, the two reduce gradients compared, and\nattention as a fold over a matrix product."""

from __future__ import annotations

import numpy as np

import fold


def weighted_product(xs, w):
    """prod_i <xs_i, w>: a reduce inside a map, then a reduce with a user operator."""
    dots = fold.map(lambda x: fold.reduce(fold.monoids.sum, x * w), xs)
    return fold.reduce(lambda a, b: a * b, dots, identity=1.0)


def linear_recurrence(a, b):
    """x_t = a_t * x_{t-1} + b_t for all t at once: a scan with a non-commutative operator on pairs."""

    def compose(first, second):
        (a1, b1), (a2, b2) = first, second
        return a1 * a2, a2 * b1 + b2

    return fold.scan(compose, (a, b), identity=(1.0, 0.0))[1]


def softmax_attention_one_query(q, K, V):
    """softmax(K q) V for one query: a fold of {z: score, v: value} with the logwsum monoid."""
    scores = K @ q
    return fold.reduce(fold.monoids.logwsum, {"z": scores, "v": V})["v"]


def pairwise_products(w):
    """sum_{j<i} w_j w_i with the (P, S) operator of the Futhark AD slides (the pairwise monoid)."""
    return fold.reduce(fold.monoids.pairwise, (w * 0.0, w))[0]


def attention(Q, K, V):
    """softmax(Q K^T / sqrt(F)) V with gemm_map_reduce: never holds the M x N score matrix."""
    scale = 1.0 / np.sqrt(Q.shape[1])
    return fold.gemm_map_reduce(fold.monoids.logwsum, lambda s, v: {"z": s * scale, "v": v}, Q, K, cols=(V,))["v"]


def section(title: str) -> None:
    print(f"\n== {title} ==")


def main(n: int = 6, d: int = 3, big: int = 200_000, m: int = 8192) -> None:
    rng = np.random.default_rng(0)
    xs, w = rng.uniform(0.5, 1.5, (n, d)), rng.uniform(0.5, 1.5, d)

    section("weighted_product: the program fold traced")
    print(fold.trace(weighted_product, xs, w))
    print(f"fold.run        = {float(fold.run(weighted_product, xs, w)):.12f}")
    print(f"np.prod(xs @ w) = {float(np.prod(xs @ w)):.12f}")

    section("its gradient program (reverse mode by re-execution)")
    from fold import ad

    grad_program, _ = ad.vjp_program(fold.trace(weighted_product, xs, w))
    print(grad_program)
    gx, gw = fold.grad(weighted_product, argnums=(0, 1))(xs, w)
    p, dots = np.prod(xs @ w), xs @ w
    print(f"largest error of fold.grad against the analytic gradient: "
          f"{max(np.max(np.abs(gx - (p / dots)[:, None] * w)), np.max(np.abs(gw - ((p / dots)[:, None] * xs).sum(0)))):.2e}")

    section("linear_recurrence by scan vs a Python loop")
    a, b = rng.uniform(0.5, 1.0, 8), rng.normal(size=8)
    x, loop_xs = 0.0, []
    for at, bt in zip(a, b):
        x = at * x + bt
        loop_xs.append(x)
    print("scan:", np.round(fold.jit(linear_recurrence)(a, b), 6))
    print("loop:", np.round(loop_xs, 6))

    section(f"generic vs monoid gradients: softmax attention for one query ({big} keys, D=16)")
    q, K, V = rng.normal(size=8), rng.normal(size=(big, 8)) / 3, rng.normal(size=(big, 16))
    print(fold.compare_rules(softmax_attention_one_query, (q, K, V), rng.normal(size=16)))

    section(f"generic vs monoid gradients: the pairwise-products operator ({big} numbers)")
    print(fold.compare_rules(pairwise_products, (rng.normal(size=big),), 1.0))

    section(f"attention with gemm_map_reduce, M = N = {m}, F = D = 64, float32")
    Q, K, V = (rng.normal(size=(m, 64)).astype(np.float32) for _ in range(3))
    s = Q @ K.T / np.float32(8.0)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    naive = (p / p.sum(axis=1, keepdims=True)) @ V
    print(f"largest difference to the naive formula: {np.max(np.abs(fold.jit(attention)(Q, K, V) - naive)):.2e}")
    print(f"estimated peak memory: {fold.memory(attention, Q, K, V) / 2**20:.1f} MiB "
          f"(the naive scores alone take {m * m * 4 / 2**20:.0f} MiB)")
    dQ, dK, dV = fold.vjp(attention, Q, K, V)[1](np.ones((m, 64), np.float32))
    print(f"gradients (no backward written): |dQ| = {np.linalg.norm(dQ):.3f}, |dK| = {np.linalg.norm(dK):.3f}, "
          f"|dV| = {np.linalg.norm(dV):.3f}")


if __name__ == "__main__":
    main()
