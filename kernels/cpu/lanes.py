"""Lane forms of mappers: the same function applied to several elements (its lanes) in one call.

A mapper whose body calls a transcendental function (exp, log, sin, ...) spends most of its time in libm,
one call per element. Its lane form computes L elements at once (WIDTH, or WIDE for float32) and calls the
vector variants of kernels.cpu.vector_math, one call per register of elements. Kernels that map (map,
map_reduce, the segmented reduce, map_scan) use a mapper's lane form, when it has one, for L elements per
step, and the mapper itself for what is left over; the elements, and the order in which they are combined,
are the same either way.

The lane form of a mapper of p scalar arguments and r scalar results takes p tuples, each an argument's L
lanes, and returns a tuple of L * r scalars, each result's lanes together. Whoever compiles a mapper
registers its lane form here, with L.
"""

from __future__ import annotations

import weakref
from typing import Any

# The elements a lane form computes at once: four by default (one AVX2 register of float64, libmvec's
# four-lane variants); eight where its transcendentals are all float32 (WIDE: one AVX2 register of float32,
# the eight-lane variants). Against four float32 lanes in an SSE register (before session 61), exp of 2^24
# float32 took 9.5 against 18 ms mapped and 17 against 27 ms summed. Eight float64 lanes (two calls) gain
# nothing, and a max-shifted logsumexp's fold ran 1.4x slower in them (8 chains, values spilled).
WIDTH = 4
WIDE = 8

_FORMS: "weakref.WeakKeyDictionary[Any, tuple[Any, int]]" = weakref.WeakKeyDictionary()


def register(mapper: Any, lane_form: Any, width: int = WIDTH) -> None:
    """Record `lane_form` as the `width`-lane form of `mapper` (both Numba-compiled)."""
    _FORMS[mapper] = (lane_form, width)


def lane_form(mapper: Any) -> Any | None:
    """The registered lane form of `mapper`, or None."""
    found = None if mapper is None else _FORMS.get(mapper)
    return None if found is None else found[0]


def lane_width(mapper: Any) -> int:
    """The lanes of `mapper`'s lane form (0 where it has none): the elements a kernel maps per call of it."""
    found = None if mapper is None else _FORMS.get(mapper)
    return 0 if found is None else found[1]


def lane_call(targets: list[str], arguments: list[list[str]]) -> str:
    """`t_0_0, t_0_1, ... = mapper_lanes((a_0 lanes...), (a_1 lanes...))`, for the kernel templates:
    `targets[r][lane]` names result r in each lane, `arguments[p][lane]` argument p in each lane. Each
    argument's lanes travel as one tuple, so that a call has as many arguments as the mapper has parameters
    (CPython compiles a call of more than 30 arguments to a *args call, which Numba cannot inline)."""
    flat_targets = ", ".join(name for per_result in targets for name in per_result)
    grouped = ", ".join(f"({', '.join(per_argument)},)" for per_argument in arguments)
    return f"{flat_targets}, = mapper_lanes({grouped})"


__all__ = ["WIDE", "WIDTH", "lane_call", "lane_form", "lane_width", "register"]
