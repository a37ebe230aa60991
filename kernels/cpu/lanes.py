"""Four-lane forms of mappers: the same function applied to WIDTH elements in one call.

A mapper whose body calls a transcendental function (exp, log, sin, ...) spends most of its time in libm,
one call per element. Its lane form computes WIDTH elements at once and calls the vector variants of
kernels.cpu.vector_math, one call per WIDTH elements. Kernels that map (map, map_reduce, the segmented
reduce, map_scan) use a mapper's lane form, when it has one, for WIDTH elements per step, and the mapper itself for
what is left over; the elements, and the order in which they are combined, are the same either way.

The lane form of a mapper of p scalar arguments and r scalar results takes WIDTH * p scalars, each
argument's WIDTH lanes together (a_0 lanes 0..WIDTH-1, then a_1's, ...), and returns a tuple of WIDTH * r
scalars in the same order. Whoever compiles a mapper registers its lane form here.
"""

from __future__ import annotations

import weakref
from typing import Any

from .vector_math import WIDTH

_FORMS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def register(mapper: Any, lane_form: Any) -> None:
    """Record `lane_form` as the WIDTH-lane form of `mapper` (both Numba-compiled)."""
    _FORMS[mapper] = lane_form


def lane_form(mapper: Any) -> Any | None:
    """The registered lane form of `mapper`, or None."""
    return None if mapper is None else _FORMS.get(mapper)


def lane_call(targets: list[str], arguments: list[list[str]]) -> str:
    """`t_0_0, t_0_1, ... = mapper_lanes(a_0 lanes..., a_1 lanes...)`, for the kernel templates:
    `targets[r][lane]` names result r in each lane, `arguments[p][lane]` argument p in each lane."""
    flat_targets = ", ".join(name for per_result in targets for name in per_result)
    flat_arguments = ", ".join(name for per_argument in arguments for name in per_argument)
    return f"{flat_targets}, = mapper_lanes({flat_arguments})"


__all__ = ["WIDTH", "lane_call", "lane_form", "register"]
