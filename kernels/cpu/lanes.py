"""Lane forms of mappers: the same function applied to WIDTH elements in one call.

A mapper whose body calls a transcendental function (exp, log, sin, ...) spends most of its time in libm,
one call per element. Its lane form computes WIDTH elements at once and calls the vector variants of
kernels.cpu.vector_math, one call per WIDTH elements. Kernels that map (map, map_reduce, the segmented
reduce, map_scan) use a mapper's lane form, when it has one, for WIDTH elements per step, and the mapper itself for
what is left over; the elements, and the order in which they are combined, are the same either way.

The lane form of a mapper of p scalar arguments and r scalar results takes p tuples, each an argument's
WIDTH lanes (a_0's lanes 0..WIDTH-1, then a_1's, ...), and returns a tuple of WIDTH * r scalars, each
result's lanes together. Whoever compiles a mapper registers its lane form here.
"""

from __future__ import annotations

import weakref
from typing import Any

# The elements a lane form computes at once: eight, one AVX2 register of float32 for libmvec's eight-lane
# variants (two calls of the four-lane variant for float64). Against four lanes (an SSE register of float32,
# before session 61), exp of 2^24 float32 took 9.5 against 18 ms mapped and 17 against 27 ms summed.
WIDTH = 8

_FORMS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def register(mapper: Any, lane_form: Any) -> None:
    """Record `lane_form` as the WIDTH-lane form of `mapper` (both Numba-compiled)."""
    _FORMS[mapper] = lane_form


def lane_form(mapper: Any) -> Any | None:
    """The registered lane form of `mapper`, or None."""
    return None if mapper is None else _FORMS.get(mapper)


def lane_call(targets: list[str], arguments: list[list[str]]) -> str:
    """`t_0_0, t_0_1, ... = mapper_lanes((a_0 lanes...), (a_1 lanes...))`, for the kernel templates:
    `targets[r][lane]` names result r in each lane, `arguments[p][lane]` argument p in each lane. Each
    argument's lanes travel as one tuple, so that a call has as many arguments as the mapper has parameters
    (CPython compiles a call of more than 30 arguments to a *args call, which Numba cannot inline)."""
    flat_targets = ", ".join(name for per_result in targets for name in per_result)
    grouped = ", ".join(f"({', '.join(per_argument)},)" for per_argument in arguments)
    return f"{flat_targets}, = mapper_lanes({grouped})"


__all__ = ["WIDTH", "lane_call", "lane_form", "register"]
