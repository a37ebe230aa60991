"""Elementwise scalar operations as NumPy functions; broadcasting covers the batch dimensions."""

from __future__ import annotations

import numpy as np

from fold.primitives import SCALAR_OPS, Elementwise

from .. import donation
from ..interpreter import numpy_impls


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # 1 / (1 + exp(-x)): exp(-x) overflows to inf for very negative x, giving the right limit 0; about 10x
    # faster than exp(-logaddexp(0, -x)) (NumPy's logaddexp is slow), which dominated the gemm MLP's time
    x = np.asarray(x)
    with np.errstate(over="ignore"):
        return np.asarray(1.0 / (1.0 + np.exp(-x))).astype(x.dtype, copy=False)


NUMPY_SCALAR_FNS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "pow": np.power,
    "mod": np.mod, "floordiv": np.floor_divide, "maximum": np.maximum, "minimum": np.minimum,
    "logaddexp": np.logaddexp, "neg": np.negative, "abs": np.abs, "sign": np.sign, "exp": np.exp,
    "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
    "sqrt": np.sqrt, "sigmoid": _sigmoid, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal, "and": np.logical_and,
    "or": np.logical_or, "not": np.logical_not, "where": np.where,
}
assert set(NUMPY_SCALAR_FNS) == set(SCALAR_OPS), set(SCALAR_OPS) ^ set(NUMPY_SCALAR_FNS)


@numpy_impls.register(Elementwise)
def _elementwise(prim: Elementwise, args: list[np.ndarray], depth: int) -> list[np.ndarray]:
    fn = NUMPY_SCALAR_FNS[prim.op]
    out = donation.ufunc_output(args, fn) if isinstance(fn, np.ufunc) else None
    if out is not None:  # an operand no one else holds takes the result (runtime/donation.py)
        return [fn(*args, out=out)]
    return [np.asarray(fn(*args))]
