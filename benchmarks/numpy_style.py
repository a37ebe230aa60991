"""Programs written the NumPy way (broadcasting, `axis=` reductions, `keepdims`, `@`), once for both columns:
each is a function of the array namespace `xp`, called with `numpy` for fold (NumPy's functions trace on
fold's arrays) and with `jax.numpy` for JAX. bench_natural's `--set numpy` (written in session 53, measured
before any change for them)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


def layernorm(xp: Any) -> Callable:
    def f(X, g, b):
        mu = xp.mean(X, axis=1, keepdims=True)
        var = xp.mean((X - mu) ** 2, axis=1, keepdims=True)
        return xp.sum(xp.tanh((X - mu) / xp.sqrt(var + 1e-5) * g + b))

    return f


def pairwise_l1_min(xp: Any) -> Callable:
    return lambda A, B: xp.sum(xp.min(xp.sum(xp.abs(A[:, None, :] - B[None, :, :]), axis=2), axis=1))


def mixture(xp: Any) -> Callable:
    def f(X, mu, logvar, logw):
        z = (X[:, None, :] - mu[None, :, :]) ** 2 * xp.exp(-logvar)[None, :, :]
        ll = -0.5 * xp.sum(z + logvar[None, :, :], axis=2) + logw[None, :]
        m = xp.max(ll, axis=1, keepdims=True)
        return -xp.sum(m[:, 0] + xp.log(xp.sum(xp.exp(ll - m), axis=1)))

    return f


def softmax_attention(xp: Any) -> Callable:
    def f(Q, K, V):
        S = Q @ K.T / np.float32(np.sqrt(Q.shape[1]))
        P = xp.exp(S - xp.max(S, axis=1, keepdims=True))
        P = P / xp.sum(P, axis=1, keepdims=True)
        return xp.sum((P @ V) ** 2)

    return f


def cosine_relu(xp: Any) -> Callable:
    def f(X, Y):
        Xn = X / xp.sqrt(xp.sum(X * X, axis=1, keepdims=True))
        Yn = Y / xp.sqrt(xp.sum(Y * Y, axis=1, keepdims=True))
        return xp.sum(xp.maximum(Xn @ Yn.T, 0.0) ** 2)

    return f


def softplus_rows(xp: Any) -> Callable:
    return lambda w, X: xp.mean(xp.sum(xp.log1p(xp.exp(X * w[None, :])), axis=1))


# `--set numpy2`: written in session 61 and measured before any change for them (a probe found fold 1.6-9x
# slower than JAX on several primal programs): Poisson regression's loss, batch normalisation (sums over the
# first axis), a cumulative sum, a Gaussian kernel sum in matrix form, a two-layer network, a logsumexp over
# each column, softplus of an outer product, a triplet margin loss, the Gram matrix's squared norm, and the
# largest row norm.
def poisson(xp: Any) -> Callable:
    def f(w, X, y):
        z = X @ w
        return xp.sum(xp.exp(z) - y * z)

    return f


def batchnorm(xp: Any) -> Callable:
    def f(X, g, b):
        mu = xp.mean(X, axis=0)
        var = xp.mean((X - mu) ** 2, axis=0)
        return xp.sum(((X - mu) / xp.sqrt(var + 1e-5) * g + b) ** 2)

    return f


def gauss_matrix(xp: Any) -> Callable:
    def f(A, B):
        squared = xp.sum(A * A, axis=1)[:, None] + xp.sum(B * B, axis=1)[None, :] - 2.0 * (A @ B.T)
        return xp.sum(xp.exp(-squared))

    return f


def logsumexp_columns(xp: Any) -> Callable:
    def f(X):
        m = xp.max(X, axis=0)
        return xp.sum(xp.log(xp.sum(xp.exp(X - m), axis=0)) + m)

    return f


PROGRAMS: dict[str, Callable[[Any], Callable]] = {
    "layernorm_np": layernorm, "pairwise_l1_min": pairwise_l1_min, "mixture_np": mixture,
    "softmax_attention_np": softmax_attention, "cosine_relu_np": cosine_relu, "softplus_rows_np": softplus_rows,
    # --set numpy2
    "poisson_np": poisson, "batchnorm_np": batchnorm, "cumsum_np": lambda xp: lambda x: xp.sum(xp.cumsum(x) ** 2),
    "gauss_matrix_np": gauss_matrix, "mlp_np": lambda xp: lambda X, W1, W2: xp.sum((xp.tanh(X @ W1) @ W2) ** 2),
    "logsumexp_columns_np": logsumexp_columns,
    "outer_softplus_np": lambda xp: lambda u, v: xp.sum(xp.log1p(xp.exp(u[:, None] * v[None, :]))),
    "triplet_np": lambda xp: lambda A, P, N: xp.sum(xp.maximum(
        xp.sum((A - P) ** 2, axis=1) - xp.sum((A - N) ** 2, axis=1) + 1.0, 0.0)),
    "gram_np": lambda xp: lambda X: xp.sum((X.T @ X) ** 2),
    "norms_max_np": lambda xp: lambda X: xp.max(xp.linalg.norm(X, axis=1)),
}


def later_sizes(quick: bool) -> dict[str, dict[str, int]]:
    """`--set numpy2`'s sizes."""
    if quick:
        return {"poisson_np": dict(n=2000, d=8), "batchnorm_np": dict(n=200, m=16), "cumsum_np": dict(n=1000),
                "gauss_matrix_np": dict(n=64, m=48, d=4), "mlp_np": dict(n=500, d=8, h=16, o=4),
                "logsumexp_columns_np": dict(n=100, m=50), "outer_softplus_np": dict(n=64, m=48),
                "triplet_np": dict(n=2000, d=8), "gram_np": dict(n=500, d=8), "norms_max_np": dict(n=2000, d=8)}
    return {"poisson_np": dict(n=10**6, d=16), "batchnorm_np": dict(n=10**5, m=256), "cumsum_np": dict(n=10**7),
            "gauss_matrix_np": dict(n=2048, m=2048, d=16), "mlp_np": dict(n=10**5, d=32, h=64, o=16),
            "logsumexp_columns_np": dict(n=10**4, m=1000), "outer_softplus_np": dict(n=4096, m=4096),
            "triplet_np": dict(n=10**6, d=16), "gram_np": dict(n=10**5, d=64), "norms_max_np": dict(n=10**6, d=32)}


def sizes(quick: bool) -> dict[str, dict[str, int]]:
    if quick:
        return {"layernorm_np": dict(n=200, m=32), "pairwise_l1_min": dict(n=60, m=40, d=3),
                "mixture_np": dict(n=300, k=5, d=4), "softmax_attention_np": dict(n=64, m=48, d=8),
                "cosine_relu_np": dict(n=64, m=48, d=8), "softplus_rows_np": dict(n=2000, d=8)}
    return {"layernorm_np": dict(n=2**15, m=256), "pairwise_l1_min": dict(n=4096, m=1024, d=8),
            "mixture_np": dict(n=10**5, k=32, d=16), "softmax_attention_np": dict(n=2048, m=2048, d=64),
            "cosine_relu_np": dict(n=4096, m=2048, d=32), "softplus_rows_np": dict(n=10**6, d=16)}


def inputs(case: str, s: dict, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    f32 = np.float32
    if case == "layernorm_np":
        return (rng.normal(size=(s["n"], s["m"])).astype(f32), (1.0 + 0.1 * rng.normal(size=s["m"])).astype(f32),
                (0.1 * rng.normal(size=s["m"])).astype(f32))
    if case == "pairwise_l1_min":
        return rng.normal(size=(s["n"], s["d"])).astype(f32), rng.normal(size=(s["m"], s["d"])).astype(f32)
    if case == "mixture_np":
        return (rng.normal(size=(s["n"], s["d"])).astype(f32), rng.normal(size=(s["k"], s["d"])).astype(f32),
                (0.2 * rng.normal(size=(s["k"], s["d"]))).astype(f32), (0.1 * rng.normal(size=s["k"])).astype(f32))
    if case == "softmax_attention_np":
        return tuple(rng.normal(size=(r, s["d"])).astype(f32) for r in (s["n"], s["m"], s["m"]))
    if case == "cosine_relu_np":
        return rng.normal(size=(s["n"], s["d"])).astype(f32), rng.normal(size=(s["m"], s["d"])).astype(f32)
    if case == "softplus_rows_np":
        return (0.3 * rng.normal(size=s["d"])).astype(f32), rng.normal(size=(s["n"], s["d"])).astype(f32)
    return _later_inputs(case, s, rng)


def _later_inputs(case: str, s: dict, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (scale * rng.normal(size=shape)).astype(np.float32)

    if case == "poisson_np":
        return normal(s["d"], scale=0.1), normal(s["n"], s["d"]), rng.poisson(1.0, s["n"]).astype(np.float32)
    if case == "batchnorm_np":
        return normal(s["n"], s["m"]), normal(s["m"]), normal(s["m"])
    if case == "cumsum_np":
        return (normal(s["n"], scale=1e-3),)
    if case == "gauss_matrix_np":
        return normal(s["n"], s["d"], scale=0.3), normal(s["m"], s["d"], scale=0.3)
    if case == "mlp_np":
        return normal(s["n"], s["d"]), normal(s["d"], s["h"], scale=0.2), normal(s["h"], s["o"], scale=0.2)
    if case == "logsumexp_columns_np":
        return (normal(s["n"], s["m"]),)
    if case == "outer_softplus_np":
        return normal(s["n"]), normal(s["m"])
    if case == "triplet_np":
        return normal(s["n"], s["d"]), normal(s["n"], s["d"]), normal(s["n"], s["d"])
    if case == "gram_np":
        return (normal(s["n"], s["d"], scale=0.1),)
    if case == "norms_max_np":
        return (normal(s["n"], s["d"]),)
    raise KeyError(case)
