"""kernels/cpu/copy_propagation.py: fold's copy propagation in numba's place gives numba's results, on the
dataflow of real parallel kernels as numba compiles them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import njit, prange
from numba.core import ir_utils
from numba.parfors import parfor

from fold.kernels.cpu import copy_propagation


def _branchy(x, y, n):
    # prange loops inside a sequential loop, copies made and killed on some paths only: a dataflow of many
    # blocks, loops and nested parallel loops
    total = 0.0
    a = x
    b = y
    for step in range(n):
        c = a
        if step % 2 == 0:
            a = b
            b = c
        s = 0.0
        for i in prange(a.shape[0]):
            t = a[i]
            u = t
            if u > 0.5:
                u = b[i]
            s += u * t
        for i in prange(b.shape[0]):
            v = b[i] if i % 3 else a[i]
            w = v
            b[i] = w * 0.5 + c[i]
        total += s
        while total > 10.0:
            total = total / 3.0
    return total


def _numba_s(name: str):
    """numba's own function `name`, whether or not fold's is installed in its place."""
    return copy_propagation.replaced.get(name) or getattr(ir_utils, name)


# fold's functions go in numba's place only over the numba source they were written against: with another
# numba they are not used, and the tests comparing them with it say so instead of failing on its changes
WRITTEN_AGAINST = all(copy_propagation.source_digest(_numba_s(name)) == digest
                      for name, digest in copy_propagation._REPLACED_SOURCES.items())
against_this_numba = pytest.mark.skipif(
    not WRITTEN_AGAINST, reason="this numba's copy propagation is not the one fold's replaces, so fold's is not in use")


def _checked(calls):
    """copy_propagate as installed, run beside numba's own on the same blocks; their results compared."""
    ours = copy_propagation.copy_propagate
    numbas = copy_propagation.replaced["copy_propagate"]
    numba_init = copy_propagation.replaced["init_copy_propagate_data"]

    def both(blocks, typemap):
        ir_utils.init_copy_propagate_data = numba_init
        try:
            expected = numbas(blocks, typemap)
        finally:
            ir_utils.init_copy_propagate_data = copy_propagation.init_copy_propagate_data
        found = ours(blocks, typemap)
        calls.append((len(blocks), sum(len(v) for v in expected[0].values()), found == expected))
        return found

    return both


def test_fold_s_copy_propagation_is_installed_over_the_numba_it_was_written_against():
    assert copy_propagation.install() == WRITTEN_AGAINST
    if not WRITTEN_AGAINST:
        assert ir_utils.copy_propagate is not copy_propagation.copy_propagate
        return
    assert ir_utils.copy_propagate is copy_propagation.copy_propagate
    assert ir_utils.init_copy_propagate_data is copy_propagation.init_copy_propagate_data
    assert parfor.copy_propagate is copy_propagation.copy_propagate
    assert set(copy_propagation.replaced) == {"copy_propagate", "init_copy_propagate_data"}


@against_this_numba
def test_it_gives_numba_s_copies_on_every_block_of_a_parallel_kernel(monkeypatch):
    assert copy_propagation.install()
    calls: list = []
    checked = _checked(calls)
    monkeypatch.setattr(ir_utils, "copy_propagate", checked)
    monkeypatch.setattr(parfor, "copy_propagate", checked)
    kernel = njit(parallel=True)(_branchy)
    x, y = np.linspace(0.0, 1.0, 37), np.linspace(1.0, 0.0, 37)
    result = kernel(x.copy(), y.copy(), 5)
    assert result == pytest.approx(_branchy(x.copy(), y.copy(), 5))
    assert len(calls) >= 4, calls  # the whole kernel and each parallel loop, in several passes
    assert max(blocks for blocks, _, _ in calls) >= 10, calls
    assert sum(copies for _, copies, _ in calls) > 0, calls  # some block starts with copies known
    assert all(same for _, _, same in calls), calls


def _put_numba_s_back(monkeypatch):
    """numba's own functions in place again for one test, as before install()."""
    monkeypatch.setattr(ir_utils, "copy_propagate", copy_propagation.replaced["copy_propagate"])
    monkeypatch.setattr(ir_utils, "init_copy_propagate_data", copy_propagation.replaced["init_copy_propagate_data"])
    monkeypatch.setattr(parfor, "copy_propagate", copy_propagation.replaced["copy_propagate"])


@against_this_numba
def test_fold_keep_numba_copy_propagation_keeps_numba_s_own(monkeypatch):
    assert copy_propagation.install()
    _put_numba_s_back(monkeypatch)
    monkeypatch.setenv("FOLD_KEEP_NUMBA_COPY_PROPAGATION", "1")
    assert not copy_propagation.install()
    assert ir_utils.copy_propagate is copy_propagation.replaced["copy_propagate"]
    monkeypatch.delenv("FOLD_KEEP_NUMBA_COPY_PROPAGATION")
    assert copy_propagation.install() and ir_utils.copy_propagate is copy_propagation.copy_propagate


@against_this_numba
def test_it_is_not_installed_over_a_copy_propagation_it_was_not_written_against(monkeypatch):
    assert copy_propagation.install()
    _put_numba_s_back(monkeypatch)
    monkeypatch.setitem(copy_propagation._REPLACED_SOURCES, "copy_propagate", "0" * 64)
    assert not copy_propagation.install()
    assert ir_utils.copy_propagate is copy_propagation.replaced["copy_propagate"]
    assert parfor.copy_propagate is copy_propagation.replaced["copy_propagate"]


_NAMES = ("a", "b", "c", "d", "e")


def _blocks(layout):
    """numba IR blocks from a drawn layout: per block, assignments (target, source name or None for a
    constant) and the blocks it may go to next (none: it returns)."""
    from numba.core import ir

    scope, loc = ir.Scope(None, ir.Loc("generated", 0)), ir.Loc("generated", 0)
    var = {name: ir.Var(scope, name, loc) for name in _NAMES + ("cond",)}
    blocks = {}
    for label, (assignments, targets) in enumerate(layout):
        block = ir.Block(scope, loc)
        for target, source in assignments:
            value = ir.Const(1.0, loc) if source is None else var[source]
            block.append(ir.Assign(value, var[target], loc))
        if not targets:
            block.append(ir.Return(var["a"], loc))
        elif len(targets) == 1:
            block.append(ir.Jump(targets[0], loc))
        else:
            block.append(ir.Branch(var["cond"], targets[0], targets[1], loc))
        blocks[label] = block
    return blocks


@st.composite
def _layouts(draw):
    n = draw(st.integers(2, 7))
    layout = []
    for label in range(n):
        assignments = draw(st.lists(st.tuples(st.sampled_from(_NAMES), st.sampled_from(_NAMES + (None,))),
                                    max_size=5))
        # every block is reached: each one may go to the next, and anywhere else (loops included)
        nexts = [label + 1] if label + 1 < n else []
        others = draw(st.lists(st.integers(0, n - 1), max_size=1 if nexts else 2))
        layout.append(([(t, s) for t, s in assignments if s != t], (nexts + others)[:2]))
    return layout


@against_this_numba
@given(_layouts())
def test_it_gives_numba_s_copies_on_any_control_flow(layout):
    from numba.core import types

    assert copy_propagation.install()
    typemap = {name: types.float64 for name in _NAMES} | {"cond": types.boolean}
    blocks = _blocks(layout)
    numba_init = copy_propagation.replaced["init_copy_propagate_data"]
    ir_utils.init_copy_propagate_data = numba_init
    try:
        expected = copy_propagation.replaced["copy_propagate"](blocks, typemap)
        expected_init = numba_init(blocks, 0, typemap)
    finally:
        ir_utils.init_copy_propagate_data = copy_propagation.init_copy_propagate_data
    assert copy_propagation.copy_propagate(blocks, typemap) == expected
    assert copy_propagation.init_copy_propagate_data(blocks, 0, typemap) == expected_init
