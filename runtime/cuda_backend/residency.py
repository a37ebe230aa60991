"""How a statement runs on the cuda backend with its values on the device: lowered to a kernel where a rule
says so, else on the host, its device inputs copied there and its results copied back (each copy counted by
device.py). Every statement of a program passes through `resident` (the cuda rule table's default), so none
reads a device array as a NumPy one.

On a real GPU with CuPy, an elementwise statement runs on the device with CuPy's ufuncs instead
(device.elementwise): no copies. Under the simulator that path returns None and the statement runs on the
host, counted; so the simulator's counts are an upper bound of a GPU's.
"""

from __future__ import annotations

import functools
from typing import Callable

from fold.primitives import Elementwise

from ..interpreter import numpy_impls
from . import device


def resident(rule: Callable | None) -> Callable:
    """`rule` (or none) as a rule that never declines: where it returns None, `on_host` runs the statement."""
    def run(prim, values: list, depth: int) -> list:
        outs = None if rule is None else rule(prim, values, depth)
        return on_host(prim, values, depth) if outs is None else outs

    return functools.wraps(rule)(run) if rule is not None else run


def on_host(prim, values: list, depth: int) -> list:
    """The numpy implementation of the statement: directly where no value is on the device (a body that the
    numpy implementation runs batched), else on host copies of its inputs, its results copied back; an
    elementwise statement on CuPy's ufuncs instead where CuPy is (a real GPU only)."""
    impl = numpy_impls.lookup(prim)
    if not any(device.is_device(v) for v in values):
        return impl(prim, values, depth)
    if isinstance(prim, Elementwise):
        out = device.elementwise(prim.op, values)
        if out is not None:
            return [out]
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
