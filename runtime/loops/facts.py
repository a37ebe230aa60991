"""What is known of a value without computing it: where it must be zero.

A gradient often makes an array that is zero but at one index: a min or max reduction's cotangent goes to
the first index where the extremum is attained, `where(iota(k) == first, ct, 0)`. A nest that added up such
an array element by element would do k times the work it needs. These facts let the consumers skip it:

- `index_axis`: the element at idx is idx[axis] (an iota, broadcast or reshaped);
- `splat`: every element is one scalar (a broadcast scalar);
- `equals`: the element at idx is (idx[axis] == s), from comparing the two above;
- `onehot`: the element at idx is 0 unless idx[axis] == s: `where(equals, x, 0)` or one value added into
  zeros at s (a histogram of one entry, build.py), kept by products, negation, conversion, transposes, and
  by a map whose rows vanish with such a row;
- `zero_unless`: the whole value is 0 unless a condition holds: a map's row taken from a one-hot array, and
  what products and sums of such rows make;
- `equal_to`: (x, s): the element at idx is (x[idx] == s), comparing an array with a splat scalar;
- `first_of`: (axis, cond, last): the element at idx is idx[axis] where cond holds there, else `last`, an
  integer no smaller than any index along the axis: `where(cond, iota, n)`, whose minimum along the axis is
  the first index where cond holds (a min or max gradient's: extreme_pairs.py folds it with the extreme);
- `bounds`: an integer value's elements lie in [low, high] (an end None where it is not known): an iota's, a
  literal's, a map's index over an iota, and sums, differences, products, minima, maxima (a clamp), selections,
  quotients by a positive literal and remainders by a positive divisor of those (interval arithmetic). A
  gather at indices bounded at both ends within its array reads without a check.

A consumer that adds up a one-hot array (a sum over the map's axis, a sum over the one-hot axis, a matrix
product contracting it) reads the one index s instead of all of them, and none when s is out of range. As
in a sparse product, 0 * inf at the skipped indices is taken as 0 where the dense sum would give NaN.
"""

from __future__ import annotations

import dataclasses
from typing import Any

_PRODUCTS = {"mul"}
_KEEPS = {"neg", "convert"}  # f(0) == 0 for these unary operations
_SUMS = {"add", "sub"}


def with_facts(value: Any, facts: dict) -> Any:
    """`value` with the facts that apply to its kind (a Scalar carries only zero_unless)."""
    allowed = {f.name for f in dataclasses.fields(value)}
    facts = {k: v for k, v in facts.items() if k in allowed and v is not None}
    return dataclasses.replace(value, **facts) if facts else value


def _fact(value: Any, name: str) -> Any:
    return getattr(value, name, None)


def _splat(value: Any) -> str | None:
    """The scalar every element of `value` equals, where that is known."""
    if value.shape == () and hasattr(value, "expr"):
        return value.expr
    return _fact(value, "splat")


def is_zero(value: Any) -> bool:
    from .build import literal

    return value.shape == () and hasattr(value, "expr") and value.expr in (literal(0, value.dtype), literal(0.0, value.dtype))


def _bounded(op: str, args: list) -> tuple[int | None, int | None] | None:
    """[low, high] of an integer result from its arguments' (interval arithmetic; None for an end not known),
    or None where neither end is known."""
    if op not in _INTERVALS:
        return None
    known = [_fact(a, "bounds") or (None, None) for a in args]
    low, high = _INTERVALS[op](*known)
    return None if low is None and high is None else (low, high)


def _both(f, x, y):
    return None if x is None or y is None else f(x, y)


def _known(f, *ends):
    """f of the ends that are known, or None where none is."""
    ends = [e for e in ends if e is not None]
    return f(ends) if ends else None


def _multiplied(a, b):
    """a * b: the least and greatest of the ends' products, where all four ends are known."""
    if None in (*a, *b):
        return None, None
    products = [x * y for x in a for y in b]
    return min(products), max(products)


def _divided(a, b):
    """a // d, for a divisor that is one positive literal d."""
    d = b[0] if b[0] is not None and b[0] == b[1] and b[0] > 0 else None
    return (None, None) if d is None else (_both(lambda x, y: x // y, a[0], d), _both(lambda x, y: x // y, a[1], d))


_INTERVALS = {
    "add": lambda a, b: (_both(int.__add__, a[0], b[0]), _both(int.__add__, a[1], b[1])),
    "sub": lambda a, b: (_both(int.__sub__, a[0], b[1]), _both(int.__sub__, a[1], b[0])),
    "mul": _multiplied,
    # max(a, b) is at least each known low; min(a, b) at most each known high (a clamp bounds both ends)
    "maximum": lambda a, b: (_known(max, a[0], b[0]), _both(max, a[1], b[1])),
    "minimum": lambda a, b: (_both(min, a[0], b[0]), _known(min, a[1], b[1])),
    "where": lambda cond, a, b: (_both(min, a[0], b[0]), _both(max, a[1], b[1])),
    # NumPy's integer remainder has the divisor's sign: a positive divisor's lies in [0, divisor - 1]
    "mod": lambda a, b: (0, b[1] - 1) if b[0] is not None and b[0] > 0 else (None, None),
    "floordiv": _divided,
}


def elementwise_facts(op: str, args: list, out: Any) -> dict:
    """The facts of `op`'s result from its arguments'."""
    facts = _comparison_facts(args, out) if op == "eq" else {**_zero_facts(op, args), **_first_of(op, args, out)}
    bounds = _bounded(op, args) if out.dtype.kind in "iu" else None
    return facts if bounds is None else {**facts, "bounds": bounds}


def _comparison_facts(args: list, out: Any) -> dict:
    """x == a splat s: `equals` where x is an index along an axis, else `equal_to` where x is an array."""
    for x, y in ((args[0], args[1]), (args[1], args[0])):
        axis, s = _fact(x, "index_axis"), _splat(y)
        if s is None:
            continue
        if axis is not None:
            return {"equals": (axis, s)}
        if x.shape == out.shape != ():
            return {"equal_to": (x, s)}
    return {}


def _zero_facts(op: str, args: list) -> dict:
    if op == "where":
        cond, a, b = args
        if not is_zero(b):
            return {}
        onehot = _fact(cond, "equals") or _fact(a, "onehot")
        return {"onehot": onehot, "zero_unless": _fact(a, "zero_unless")}
    if op in _KEEPS:
        return {"onehot": _fact(args[0], "onehot"), "zero_unless": _fact(args[0], "zero_unless")}
    if op in _PRODUCTS:
        return {"onehot": _fact(args[0], "onehot") or _fact(args[1], "onehot"),
                "zero_unless": _fact(args[0], "zero_unless") or _fact(args[1], "zero_unless")}
    if op in _SUMS:
        same = {name: _fact(args[0], name) for name in ("onehot", "zero_unless")
                if _fact(args[0], name) is not None and _fact(args[0], name) == _fact(args[1], name)}
        return same
    return {}


def _first_of(op: str, args: list, out: Any) -> dict:
    """first_of of where(cond, index along an axis, a literal no smaller than that axis' last index)."""
    if op != "where":
        return {}
    cond, a, b = args
    axis, last = _fact(a, "index_axis"), _fact(b, "bounds")
    if (axis is None or a.shape != out.shape or out.dtype.kind not in "iu" or b.shape != () or last is None
            or last[0] != last[1] or last[0] is None or last[0] < out.shape[axis] - 1):
        return {}
    return {"first_of": (axis, cond, last[0])}


def broadcast_facts(x: Any, lead: int) -> dict:
    """A broadcast adds `lead` axes in front: axis facts move with it, and a scalar becomes a splat."""
    def moved(fact):  # an axis of length 1 that the broadcast stretches no longer holds one index apart
        return None if fact is None or x.shape[fact[0]] == 1 else (fact[0] + lead,) + tuple(fact[1:])

    facts = {"zero_unless": _fact(x, "zero_unless"), "onehot": moved(_fact(x, "onehot")),
             "equals": moved(_fact(x, "equals")), "splat": _splat(x), "bounds": _fact(x, "bounds")}
    axis = _fact(x, "index_axis")
    if axis is not None and x.shape[axis] != 1:
        facts["index_axis"] = axis + lead
    return facts


def reshape_facts(x: Any, shape: tuple[int, ...]) -> dict:
    """A reshape that only adds or drops axes of length 1 keeps the axis facts, renumbered."""
    kept = [n for n in x.shape if n != 1]
    if kept != [n for n in shape if n != 1]:
        return {"zero_unless": _fact(x, "zero_unless"), "splat": _fact(x, "splat"), "bounds": _fact(x, "bounds")}
    old = [j for j, n in enumerate(x.shape) if n != 1]
    new = [j for j, n in enumerate(shape) if n != 1]
    where = dict(zip(old, new))

    def moved(fact):
        return None if fact is None or fact[0] not in where else (where[fact[0]],) + tuple(fact[1:])

    axis = _fact(x, "index_axis")
    return {"zero_unless": _fact(x, "zero_unless"), "splat": _fact(x, "splat"), "onehot": moved(_fact(x, "onehot")),
            "equals": moved(_fact(x, "equals")), "index_axis": where.get(axis) if axis is not None else None,
            "bounds": _fact(x, "bounds")}


def transpose_facts(x: Any, perm: tuple[int, ...]) -> dict:
    """A transpose moves the axis facts with their axes."""
    def moved(fact):
        return None if fact is None else (perm.index(fact[0]),) + tuple(fact[1:])

    axis = _fact(x, "index_axis")
    return {"zero_unless": _fact(x, "zero_unless"), "splat": _fact(x, "splat"),
            "onehot": moved(_fact(x, "onehot")), "equals": moved(_fact(x, "equals")),
            "index_axis": perm.index(axis) if axis is not None else None, "bounds": _fact(x, "bounds")}
