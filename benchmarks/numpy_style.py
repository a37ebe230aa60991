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


PROGRAMS: dict[str, Callable[[Any], Callable]] = {
    "layernorm_np": layernorm, "pairwise_l1_min": pairwise_l1_min, "mixture_np": mixture,
    "softmax_attention_np": softmax_attention, "cosine_relu_np": cosine_relu, "softplus_rows_np": softplus_rows,
}


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
    raise KeyError(case)
