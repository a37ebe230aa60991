"""Reverse mode by re-execution: `vjp_program` transforms a Program into its vector-Jacobian product.

The gradient program first re-emits the primal statements (the forward sweep), then walks the statements
backwards emitting each one's adjoint (the return sweep). A scope — a map body, a reduce operator — is
differentiated the same way inside its own combinator: its adjoint re-executes the scope's primal first, so
per-element intermediates of a map body are recomputed, never stored. What a statement saves for the return
sweep is decided by its forward rule (`vjp_forward_rules`); by default it saves only its outputs.

Backward rules: `rule(prim, args, outs, residual, cts) -> arg_cts`, with symbolic `Zero`s allowed both ways.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

from fold.dce import dce
from fold.errors import FoldTypeError
from fold.ir import Lit, Program, Var, flat_program
from fold.primitives import StopGradient
from fold.rules import RuleTable
from fold.tracing import bind, trace_body

from .zeros import Zero, add_any, differentiable, is_zero

vjp_rules = RuleTable("vjp")
vjp_forward_rules = RuleTable("vjp forward")

REDUCE_RULES = ("auto", "generic", "monoid")
# gemm_map_reduce's block backward: each pair a part of its row's fold where a rule allows ("pairs"), or
# each block a part, its totals recomputed ("blocks"); see ad/gemm_element_rules.py
GEMM_RULES = ("pairs", "blocks")
_config = threading.local()


def current_reduce_rule() -> str:
    return getattr(_config, "reduce_rule", REDUCE_RULES[0])


def current_gemm_rule() -> str:
    return getattr(_config, "gemm_rule", GEMM_RULES[0])


def within_a_map() -> bool:
    """Whether the program being differentiated is a map's body (its arrays a row's), not a whole program."""
    return getattr(_config, "within_a_map", False)


def rows_of_a_map() -> contextlib.AbstractContextManager[None]:
    """A map's body differentiated for the duration (`within_a_map`)."""
    return _temporarily("within_a_map", True, False)


@contextlib.contextmanager
def _temporarily(name: str, value: Any, default: Any = None) -> Iterator[None]:
    """`name` set to `value` in this thread for the duration, then restored."""
    previous = getattr(_config, name, default)
    setattr(_config, name, value)
    try:
        yield
    finally:
        setattr(_config, name, previous)


def _setting(name: str, choices: tuple[str, ...], value: str) -> contextlib.AbstractContextManager[None]:
    """`name` set to `value` (one of `choices`) in this thread for the duration, then restored."""
    if value not in choices:
        raise FoldTypeError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return _temporarily(name, value, choices[0])


def reduce_rule_scope(rule: str) -> contextlib.AbstractContextManager[None]:
    """Within it, vjp differentiates reductions with `rule`, one of REDUCE_RULES."""
    return _setting("reduce_rule", REDUCE_RULES, rule)


def gemm_rule_scope(rule: str) -> contextlib.AbstractContextManager[None]:
    """Within it, vjp differentiates gemm_map_reduce blocks with `rule`, one of GEMM_RULES."""
    return _setting("gemm_rule", GEMM_RULES, rule)


def arg_activity(n: int) -> list[bool]:
    """For the rule now differentiating a statement with `n` arguments: which of them are active, that is
    depend on an input whose cotangent was asked for. A rule needs this only where it would otherwise do
    work for a cotangent nobody wants (a fold operator's captured values, a map or loop body). It is set by
    vjp_inline around each rule call (read it before tracing anything nested); outside one, or for another
    argument count, every argument counts as active, which costs work but never changes a result."""
    mask = getattr(_config, "activity", None)
    return list(mask) if mask is not None and len(mask) == n else [True] * n


def _active_vars(program: Program, wrt: Sequence[bool] | None) -> set:
    """The variables that depend on an input marked in `wrt` (every float input when None), floats only."""
    if wrt is None:
        wrt = [True] * len(program.inputs)
    active = {v for v, m in zip(program.inputs, wrt, strict=True) if m and differentiable(v.aval)}
    for stmt in program.stmts:
        if isinstance(stmt.prim, StopGradient):
            continue
        if any(isinstance(a, Var) and a in active for a in stmt.args):
            active.update(v for v in stmt.outs if differentiable(v.aval))
    return active


def vjp_inline(program: Program, primals: Sequence[Any], cts_out: Sequence[Any] | Callable[[list], Sequence[Any]],
               wrt: Sequence[bool] | None = None) -> tuple[list, list]:
    """Emit, in the current trace, the forward sweep and the return sweep of `program`.

    `cts_out` are the output cotangents, or a function that computes them from the primal outputs (so that
    a cotangent depending on the outputs costs no second forward sweep). `wrt` marks the inputs whose
    cotangents are wanted (default: every float input); the others get `Zero`, and values that depend on
    none of the marked ones are constants of the return sweep. Returns (primal outputs, cotangents of the
    inputs), cotangents possibly `Zero`.
    """
    env: dict = dict(zip(program.inputs, primals, strict=True))
    active = _active_vars(program, wrt)

    def read(atom):
        return atom.value if isinstance(atom, Lit) else env[atom]

    residuals = []
    for stmt in program.stmts:
        args = [read(a) for a in stmt.args]
        if type(stmt.prim) in vjp_forward_rules:
            outs, residual = vjp_forward_rules.lookup(stmt.prim)(stmt.prim, args)
        else:
            outs, residual = bind(stmt.prim, *args), None
        env.update(zip(stmt.outs, outs, strict=True))
        residuals.append(residual)

    if callable(cts_out):
        cts_out = cts_out([read(a) for a in program.outputs])
    ct_env: dict = {}

    def accumulate(atom, ct):
        if isinstance(atom, Var) and atom in active and not is_zero(ct):
            ct_env[atom] = add_any(ct_env.get(atom), ct)

    for atom, ct in zip(program.outputs, cts_out, strict=True):
        accumulate(atom, ct)
    for stmt, residual in zip(reversed(program.stmts), reversed(residuals), strict=True):
        cts = [ct_env.pop(v, None) for v in stmt.outs]
        if all(is_zero(c) for c in cts):
            continue
        activity = [isinstance(a, Var) and a in active for a in stmt.args]
        if not any(activity):
            continue
        cts = [Zero(v.aval) if is_zero(c) else c for v, c in zip(stmt.outs, cts, strict=True)]
        args = [read(a) for a in stmt.args]
        outs = [env[v] for v in stmt.outs]
        with _temporarily("activity", activity):
            arg_cts = vjp_rules.lookup(stmt.prim)(stmt.prim, args, outs, residual, cts)
        for atom, ct in zip(stmt.args, arg_cts, strict=True):
            accumulate(atom, ct)
    in_cts = [ct_env.get(v) for v in program.inputs]
    return [read(a) for a in program.outputs], [Zero(v.aval) if is_zero(c) else c for v, c in zip(program.inputs, in_cts, strict=True)]


_cache: "weakref.WeakKeyDictionary[Program, dict]" = weakref.WeakKeyDictionary()


def vjp_program(
    program: Program, ct_mask: Sequence[bool] | None = None, *, wrt: Sequence[bool] | None = None,
    with_primal_outputs: bool = False,
) -> tuple[Program, list[bool]]:
    """The vjp of a closed `program`, under the current reduce rule.

    Inputs: the primal inputs, then a cotangent for each output whose `ct_mask` entry is True (default: every
    float output). Outputs: (the primal outputs, if asked,) then the cotangents of the inputs that are not
    symbolically zero; the returned mask says which inputs have one. `wrt` marks the inputs whose cotangents
    are wanted (default: every float input).
    """
    if ct_mask is None:
        ct_mask = [differentiable(a.aval) for a in program.outputs]
    ct_mask = tuple(bool(m) and differentiable(a.aval) for m, a in zip(ct_mask, program.outputs, strict=True))
    wrt = tuple(bool(m) for m in wrt) if wrt is not None else (True,) * len(program.inputs)
    key = (ct_mask, wrt, with_primal_outputs, current_reduce_rule(), current_gemm_rule(), within_a_map())
    per_program = _cache.setdefault(program, {})
    if key in per_program:
        return per_program[key]
    n = len(program.inputs)
    in_mask: list[bool] = []

    def fn(*flat):
        primals, rest = list(flat[:n]), list(flat[n:])
        cts = [rest.pop(0) if m else Zero(a.aval) for m, a in zip(ct_mask, program.outputs, strict=True)]
        outs, in_cts = vjp_inline(program, primals, cts, wrt)
        in_mask.extend(not is_zero(c) for c in in_cts)
        nonzero = [c for c in in_cts if not is_zero(c)]
        return (list(outs) if with_primal_outputs else []) + nonzero

    avals = [v.aval for v in program.inputs] + [a.aval for m, a in zip(ct_mask, program.outputs, strict=True) if m]
    traced = trace_body(fn, avals, "vjp")
    assert not traced.consts
    result = (dce(flat_program(traced.program)), in_mask)
    per_program[key] = result
    return result
