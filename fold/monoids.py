"""The built-in monoids, each commutative, each with the D of Theorem 2.1 in vector-Jacobian form.

For c = a . b, D(c, a) is dc/da written with c and a only; `d(c, a, g)` returns the cotangent of a part `a`
of a fold with total `c`, given the cotangent `g` of the total. By Theorem 2.1 the same formula then holds for
every part of a whole fold — one map instead of two scans. Where D does not exist the docstring says so:

- sum:   D = identity.                                  d = g
- prod:  dc/da = b = c / a.                             d = g * c / a   (undefined where a == 0: the
         product of the other parts is not a function of c and a then; `reduce_rule="auto"` uses the
         specialised * rule of reduce and reduce_by_index, and gemm_map_reduce's nested form, exact with zeros)
- min, max: dc/da = [a == c].                           d = g * (a == c)  (at ties every tied part gets g,
         where the true derivative is not defined; `reduce_rule="auto"` gives it to the lowest index, and
         gemm_map_reduce divides a row's g by its count of tied pairs)
- logaddexp: dc/da = exp(a - c).                        d = g * exp(a - c), and 0 where c = -inf
- wsum {v, w} (weighted mean v with total weight w >= 0):
         abar_w = g_w + <g_v, a_v - c_v> / c_w,  abar_v = g_v * a_w / c_w   (0 where c_w = 0)
- logwsum {z, v} (weights in log space: attention and online softmax; eq. 3 of the paper):
         abar_z = (g_z + <g_v, a_v - c_v>) exp(a_z - c_z),  abar_v = g_v exp(a_z - c_z)
- cross_entropy {p, n}: abar_p = g_p exp(a_p - c_p),  abar_n = g_n                  (Appendix A)
- cross_entropy_dist {q, p, n}: abar_q = g_q e^(a_q - c_q),
         abar_p = (g_p + g_n (a_n - c_n)) e^(a_p - c_p),  abar_n = g_n e^(a_p - c_p)     (Appendix A)
- vsum {v} (the MLP's vector sum): d = g
- pairwise (P, S), the sum of all pairwise products (P1 + P2 + S1 S2, S1 + S2) of the SC22 slides:
         dc_P/da_S = b_S = c_S - a_S, so abar_P = g_P,  abar_S = g_P (c_S - a_S) + g_S

Every log-space exponent is computed as exp(where(c == -inf, 0, a - c)) masked afterwards, so -inf
identities give no NaN in the operator, in D, or in their derivatives.
"""

from __future__ import annotations

import numpy as np

from . import ops
from .monoid import Monoid


def exp_weight(a, c):
    """exp(a - c), and 0 where c = -inf (then a = -inf too), 1 where a = c (+inf included, where a - c is NaN:
    the total is the +inf element's, dc/da = 1): no NaN, and no NaN in its derivatives."""
    empty = c == -np.inf
    return ops.where(empty, 0.0, ops.exp(ops.where(empty | (a == c), 0.0, a - c)))


def _inner(x, y):
    """<x, y> over all axes of one element field."""
    return ops.sum(x * y) if getattr(x, "ndim", 0) else x * y


def _scale(weight, v):
    """weight (a scalar per element) times a field v of any shape."""
    return weight * v


# ------------------------------------------------------------------------------------------ scalar monoids

sum = Monoid(lambda a, b: a + b, 0.0, commutative=True, d=lambda c, a, g: g, name="sum")  # noqa: A001

# d is undefined at a zero part, so check_monoid draws parts away from zero
prod = Monoid(lambda a, b: a * b, 1.0, commutative=True, d=lambda c, a, g: g * c / a, name="prod",
              domain=lambda a: ops.where(ops.abs(a) < 0.5, a + 1.0, a))

min = Monoid(lambda a, b: ops.minimum(a, b), np.inf, commutative=True,  # noqa: A001
             d=lambda c, a, g: ops.where(a == c, g, 0.0), name="min")

max = Monoid(lambda a, b: ops.maximum(a, b), -np.inf, commutative=True,  # noqa: A001
             d=lambda c, a, g: ops.where(a == c, g, 0.0), name="max")

logaddexp = Monoid(lambda a, b: ops.logaddexp(a, b), -np.inf, commutative=True,
                   d=lambda c, a, g: g * exp_weight(a, c), name="logaddexp")


# ------------------------------------------------------------------------------------------ record monoids

def _wsum_op(x, y):
    w = x["w"] + y["w"]
    positive = w > 0
    safe_w = ops.where(positive, w, 1.0)
    v = ops.where(positive, (_scale(x["w"], x["v"]) + _scale(y["w"], y["v"])) / safe_w, 0.0)
    return {"v": v, "w": w}


def _wsum_d(c, a, g):
    positive = c["w"] > 0
    safe_w = ops.where(positive, c["w"], 1.0)
    abar_w = g["w"] + ops.where(positive, _inner(g["v"], a["v"] - c["v"]) / safe_w, 0.0)
    abar_v = ops.where(positive, _scale(a["w"] / safe_w, g["v"]), 0.0)
    return {"v": abar_v, "w": abar_w}


# elements of weight 0 are all equivalent (their v is irrelevant), so check_monoid draws positive weights
wsum = Monoid(_wsum_op, {"v": 0.0, "w": 0.0}, commutative=True, d=_wsum_d, name="wsum",
              domain=lambda e: {"v": e["v"], "w": ops.exp(e["w"])})


def _logwsum_op(x, y):
    z = ops.logaddexp(x["z"], y["z"])
    v = _scale(exp_weight(x["z"], z), x["v"]) + _scale(exp_weight(y["z"], z), y["v"])
    return {"z": z, "v": v}


def _logwsum_d(c, a, g):
    weight = exp_weight(a["z"], c["z"])
    return {"z": (g["z"] + _inner(g["v"], a["v"] - c["v"])) * weight, "v": _scale(weight, g["v"])}


logwsum = Monoid(_logwsum_op, {"z": -np.inf, "v": 0.0}, commutative=True, d=_logwsum_d, name="logwsum")


def _cross_entropy_op(x, y):
    return {"p": ops.logaddexp(x["p"], y["p"]), "n": x["n"] + y["n"]}


cross_entropy = Monoid(_cross_entropy_op, {"p": -np.inf, "n": 0.0}, commutative=True,
                       d=lambda c, a, g: {"p": g["p"] * exp_weight(a["p"], c["p"]), "n": g["n"]},
                       name="cross_entropy")


def _cross_entropy_dist_op(x, y):
    p = ops.logaddexp(x["p"], y["p"])
    n = x["n"] * exp_weight(x["p"], p) + y["n"] * exp_weight(y["p"], p)
    return {"q": ops.logaddexp(x["q"], y["q"]), "p": p, "n": n}


def _cross_entropy_dist_d(c, a, g):
    wp = exp_weight(a["p"], c["p"])
    return {"q": g["q"] * exp_weight(a["q"], c["q"]), "p": (g["p"] + g["n"] * (a["n"] - c["n"])) * wp, "n": g["n"] * wp}


cross_entropy_dist = Monoid(_cross_entropy_dist_op, {"q": -np.inf, "p": -np.inf, "n": 0.0}, commutative=True,
                            d=_cross_entropy_dist_d, name="cross_entropy_dist")

vsum = Monoid(lambda x, y: {"v": x["v"] + y["v"]}, {"v": 0.0}, commutative=True, d=lambda c, a, g: g, name="vsum")


def _pairwise_op(x, y):
    (p1, s1), (p2, s2) = x, y
    return (p1 + p2 + s1 * s2, s1 + s2)


def _pairwise_d(c, a, g):
    (_, c_s), (_, a_s), (g_p, g_s) = c, a, g
    return (g_p, g_p * (c_s - a_s) + g_s)


pairwise = Monoid(_pairwise_op, (0.0, 0.0), commutative=True, d=_pairwise_d, name="pairwise")

BUILTIN = (sum, prod, min, max, logaddexp, wsum, logwsum, cross_entropy, cross_entropy_dist, vsum, pairwise)

__all__ = ["sum", "prod", "min", "max", "logaddexp", "wsum", "logwsum", "cross_entropy", "cross_entropy_dist",
           "vsum", "pairwise", "BUILTIN"]
