"""Shared test helpers: trace + verify + run, and comparison against an independent NumPy reference.

Every runtime test goes through `run_checked`, so every program a test builds is also checked by
`fold.check_program` (single assignment, no unbound variables, shapes that agree with the shape rules).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

import fold
from fold.pytree import tree_flatten

# relative / absolute tolerances per result dtype
TOLERANCES = {
    np.dtype("float32"): (2e-5, 1e-6),
    np.dtype("float64"): (1e-11, 1e-13),
}


def checked_program(f: Callable[..., Any], *args: Any) -> fold.Program:
    """Trace `f` on `args` and verify the Program (nested bodies included)."""
    program = fold.trace(f, *args)
    fold.check_program(program)
    return program


def run_checked(f: Callable[..., Any], *args: Any) -> Any:
    """Trace, verify and run `f(*args)`; the result's leaves must have the shapes and dtypes the Program says."""
    program = checked_program(f, *args)
    result = fold.run(f, *args)
    leaves, treedef = tree_flatten(result)
    assert treedef == program.out_tree, (treedef, program.out_tree)
    for leaf, aval in zip(leaves, program.out_avals, strict=True):
        assert isinstance(leaf, np.ndarray), type(leaf)
        assert leaf.shape == aval.shape and leaf.dtype == aval.dtype, (leaf.shape, leaf.dtype, aval)
    return result


def assert_close(actual: Any, expected: Any, *, dtype: Any = None, rtol: float | None = None,
                 atol: float | None = None) -> None:
    """Same pytree structure, shapes and values (to the tolerance of the dtype); same dtype if `dtype` is given."""
    a_leaves, a_def = tree_flatten(actual)
    e_leaves, e_def = tree_flatten(expected)
    assert a_def == e_def, f"structure {a_def} != {e_def}"
    for a, e in zip(a_leaves, e_leaves, strict=True):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"shape {a.shape} != expected {e.shape}"
        if dtype is not None:
            assert a.dtype == np.dtype(dtype), f"dtype {a.dtype} != expected {np.dtype(dtype)}"
        if a.dtype.kind in "biu" and e.dtype.kind in "biu":
            np.testing.assert_array_equal(a, e)
            continue
        r, t = TOLERANCES.get(a.dtype, TOLERANCES[np.dtype("float64")])
        np.testing.assert_allclose(a, e, rtol=rtol if rtol is not None else r, atol=atol if atol is not None else t)


def matprod_sequential(mats: np.ndarray, identity: np.ndarray | None = None) -> np.ndarray:
    """m_0 @ m_1 @ ... @ m_{n-1}, one at a time, left to right."""
    acc = np.eye(mats.shape[-1]) if identity is None else identity
    for m in mats:
        acc = acc @ m
    return acc


def scan_reference(op: Callable[[Any, Any], Any], xs: list, identity: Any, *, exclusive: bool, reverse: bool) -> list:
    """A plain sequential Python scan over the list `xs` (the executable definition of fold.scan)."""
    n = len(xs)
    order = range(n - 1, -1, -1) if reverse else range(n)
    out: list = [None] * n
    acc = identity
    for i in order:
        if exclusive:
            out[i] = acc
        acc = op(xs[i], acc) if reverse else op(acc, xs[i])
        if not exclusive:
            out[i] = acc
    return out


EXAMPLES = __import__("pathlib").Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str):
    """An example program from examples/ as a module (the examples are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def both(f: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """f jitted on the numpy backend (the reference) and on the numba backend, each applied to args."""
    return fold.jit(f, backend="numpy")(*args), fold.jit(f, backend="numba")(*args)


def assert_same(expected: Any, got: Any, rtol: float = 1e-12, scaled: bool = False) -> None:
    """Leaf by leaf; `scaled`: absolute errors relative to the leaf's largest value (a reassociated sum of
    large terms that cancels to a small one is exact only to the large terms' rounding)."""
    for x, y in zip(tree_flatten(expected)[0], tree_flatten(got)[0], strict=True):
        x, y = np.asarray(x), np.asarray(y)
        atol = 1e-12 * max(1.0, float(np.nanmax(np.abs(x), initial=0.0))) if scaled and x.size else 1e-12
        np.testing.assert_allclose(y, x, rtol=rtol, atol=atol)
