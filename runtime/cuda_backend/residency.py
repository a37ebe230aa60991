"""How a statement runs on the cuda backend with its values on the device: lowered to a kernel where a rule
says so, else on the host, its device inputs copied there and its results copied back (each copy counted by
device.py). Every statement of a program passes through `resident` (the cuda rule table's default), so none
reads a device array as a NumPy one.

An elementwise statement runs on the device instead (device.elementwise: CuPy's ufuncs on a GPU), and so
does a statement of ON_DEVICE, whose numpy implementation is NumPy calls that device arrays take over
(device.py): a map's batched body, the structural statements, matrix products (cuBLAS through CuPy) and
sums. None of them copies; their host operands are copied to the device first (counted).
"""

from __future__ import annotations

import functools
from typing import Callable

from fold.primitives import (BroadcastTo, Concatenate, Convert, Elementwise, Map, MatMul, Reshape, StaticIndex,
                             StopGradient, SumAxes, Transpose)

from ..interpreter import numpy_impls
from ..numba_backend.elementwise_fusion import FusedElementwise
from . import device

# The statements whose numpy implementation runs on device arrays as it is (NumPy calls and array methods
# only: no np.asarray, no host array made inside)
ON_DEVICE = frozenset({Map, Transpose, Reshape, BroadcastTo, StaticIndex, Concatenate, MatMul, SumAxes, Convert,
                       StopGradient, FusedElementwise})


def resident(rule: Callable | None) -> Callable:
    """`rule` (or none) as a rule that never declines: where it returns None, `on_host` runs the statement."""
    def run(prim, values: list, depth: int) -> list:
        outs = None if rule is None else rule(prim, values, depth)
        return on_host(prim, values, depth) if outs is None else outs

    return functools.wraps(rule)(run) if rule is not None else run


def on_host(prim, values: list, depth: int) -> list:
    """The numpy implementation of the statement: directly where no value is on the device (a body that the
    numpy implementation runs batched), on the device for an elementwise statement or one of ON_DEVICE, else
    on host copies of its inputs, its results copied back."""
    impl = numpy_impls.lookup(prim)
    if not any(device.is_device(v) for v in values):
        return impl(prim, values, depth)
    if isinstance(prim, Elementwise):
        return [device.elementwise(prim.op, values)]
    if type(prim) in ON_DEVICE:
        return impl(prim, device.on_device(values), depth)
    return device.on_device(impl(prim, device.on_host(values), depth))


def small_arguments_on_host(count: Callable[[object], int]) -> Callable[[Callable], Callable]:
    """A rule whose first `count(prim)` arguments (captured values, identities: read on the host, passed to
    kernels as scalars) are copied to the host (counted) where they are on the device."""
    def wrap(rule: Callable) -> Callable:
        @functools.wraps(rule)
        def run(prim, values: list, depth: int):
            head = count(prim)
            if any(device.is_device(v) for v in values[:head]):
                values = device.on_host(values[:head]) + list(values[head:])
            return rule(prim, values, depth)

        return run

    return wrap
