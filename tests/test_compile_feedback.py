"""A call that compiles says so (logger "fold"; a status line on a terminal), and fold.precompile compiles
ahead. The kernels here run on the numba backend whatever FOLD_BACKEND says: compiling is what it does."""

from __future__ import annotations

import io
import logging
import time

import numpy as np
import pytest

import fold
from fold.runtime import compile_feedback


@pytest.fixture
def fresh_kernels(monkeypatch):
    """No disk cache: the kernels of an operator seen first in this process are compiled, not loaded."""
    monkeypatch.setenv("FOLD_CACHE_DIR", "")


def _uncompiled_reduce(x):  # an operator with a constant no other test uses: its kernels are new to the process
    return fold.reduce(lambda a, b: a + b + 0.0173205 * a * b, x, identity=0.0)


def test_a_compiling_call_logs_each_kernel_it_compiled(fresh_kernels, caplog):
    f = fold.jit(_uncompiled_reduce, backend="numba")
    with caplog.at_level(logging.DEBUG, logger="fold"):
        f(np.linspace(0.0, 1.0, 100))
    compiled = [r.getMessage() for r in caplog.records if r.name == "fold" and "compiled kernel" in r.getMessage()]
    assert compiled, f"no 'compiled kernel' record among {[r.getMessage() for r in caplog.records]}"
    assert all("for _uncompiled_reduce" in m for m in compiled), compiled
    assert f.compile_seconds > 0.0
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="fold"):
        f(np.linspace(0.0, 1.0, 100))  # warm: nothing compiled, nothing said
    assert not [r for r in caplog.records if r.name == "fold"], [r.getMessage() for r in caplog.records]


def test_a_long_compile_says_so_at_info(fresh_kernels, caplog, monkeypatch):
    monkeypatch.setattr(compile_feedback, "NOTICE_AFTER_SECONDS", 0.0)  # every compile counts as long

    def scaled(x):
        return fold.reduce(lambda a, b: a + b + 0.0271828 * a * b, x, identity=0.0)

    with caplog.at_level(logging.INFO, logger="fold"):
        fold.jit(scaled, backend="numba")(np.linspace(0.0, 1.0, 100))
    messages = [r.getMessage() for r in caplog.records if r.name == "fold"]
    assert any(m.startswith("fold: compiling kernels for scaled") for m in messages), messages
    done = [m for m in messages if m.startswith("fold: compiled ")]
    assert len(done) == 1 and "for scaled in" in done[0], messages


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run_feedback(monkeypatch, stream) -> None:
    monkeypatch.setattr(compile_feedback, "NOTICE_AFTER_SECONDS", 0.0)
    monkeypatch.setattr("sys.stderr", stream)
    feedback = compile_feedback.CompileFeedback("g")
    feedback.kernel_started("kernel(float64)")
    deadline = time.monotonic() + 5
    while not feedback.noticed and time.monotonic() < deadline:
        time.sleep(0.01)
    feedback.kernel_compiled("kernel(float64)", 1.5)
    feedback.finish()


def test_a_terminal_gets_a_status_line(monkeypatch):
    monkeypatch.delenv("FOLD_PROGRESS", raising=False)
    terminal = _Terminal()
    _run_feedback(monkeypatch, terminal)
    text = terminal.getvalue()
    assert "\rfold: compiling kernels for g: 0 compiled, now kernel(float64)" in text, repr(text)
    assert "\rfold: compiled 1 kernel for g in 1.5 s" in text and text.endswith("\n"), repr(text)


@pytest.mark.parametrize("stream, progress", [(io.StringIO(), "1"), (_Terminal(), "0")], ids=["pipe", "FOLD_PROGRESS=0"])
def test_no_status_line_off_a_terminal_or_when_turned_off(monkeypatch, stream, progress):
    monkeypatch.setenv("FOLD_PROGRESS", progress)
    _run_feedback(monkeypatch, stream)
    assert stream.getvalue() == ""


def test_precompile_compiles_ahead_for_the_signature_given(caplog):
    def sum_of_squares(x):
        return fold.reduce(fold.monoids.sum, x * x)

    with caplog.at_level(logging.INFO, logger="fold"):
        g = fold.precompile(sum_of_squares, fold.ShapedArray((5,), np.float64))
    assert any(r.getMessage().startswith("fold: precompiled sum_of_squares in") for r in caplog.records)
    assert g.trace_count == 1
    before = g.compile_seconds
    assert float(g(np.arange(5.0))) == 30.0
    assert g.trace_count == 1 and g.compile_seconds == before  # the real call traced and compiled nothing
    g(np.arange(6.0))
    assert g.trace_count == 2  # another shape is another signature


def test_precompile_refuses_jit_options_beside_a_jitted_function():
    with pytest.raises(fold.FoldTypeError, match="fold.precompile"):
        fold.precompile(fold.jit(lambda x: x), np.ones(2), backend="numpy")
