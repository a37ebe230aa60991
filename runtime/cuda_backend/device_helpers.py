"""The numba backend's scalar helpers (NumPy's NaN, log, logaddexp, remainder and floor-division semantics) as
CUDA device functions, compiled from the same Python source, for the operators, map bodies and loop nests
that device_functions.py and loop_nests.py write.

`_mod` and `_floordiv` are typed per argument kind (numba.extending.overload); the CPU's typing of the float
remainder calls np.fmod, which CUDA does not compile, and Numba's CPU target has no math.fmod, so each gets a
CUDA overload of its own here: the same semantics with math.fmod (exact for float32 operands too: the
remainder is representable in their precision).
Under the simulator the helpers run as Python: NumPy's remainder and floor division themselves.
"""

import math

from numba import cuda, types
from numba.extending import overload

from fold.runtime.numba_backend import scalar_helpers

_TYPED = ("_mod", "_floordiv")
HELPERS = scalar_helpers.HELPERS

for _name in HELPERS:
    if _name not in _TYPED:
        globals()[_name] = cuda.jit(device=True)(getattr(scalar_helpers, _name).py_func)
_mod = scalar_helpers._mod
_floordiv = scalar_helpers._floordiv


def _integers(a, b) -> bool:
    return isinstance(a, types.Integer) and isinstance(b, types.Integer)


@overload(scalar_helpers._mod, target="cuda", inline="always")
def _mod_on_cuda(a, b):
    if _integers(a, b):
        def integer_remainder(a, b):
            if b == 0 or b == -1:
                return a * 0
            return a % b
        return integer_remainder

    def float_remainder(a, b):
        mod = math.fmod(a, b)
        if b == 0:
            return mod
        if mod == 0:
            return math.copysign(0.0, b)
        if (b < 0) != (mod < 0):
            return mod + b
        return mod
    return float_remainder


@overload(scalar_helpers._floordiv, target="cuda", inline="always")
def _floordiv_on_cuda(a, b):
    if _integers(a, b):
        def integer_quotient(a, b):
            if b == -1:
                return -a
            return a // b
        return integer_quotient

    def quotient(a, b):
        return a // b
    return quotient
