"""`check_program`: the invariants every Program keeps, checked (the tests run it on every program they make)."""

from __future__ import annotations

from .errors import FoldError, ProgramError
from .ir import Program, Var
from .tracing import shape_rules


def check_program(program: Program, _label: str = "program") -> None:
    """Raise ProgramError unless: every variable is bound once, every use is bound before it (bodies are
    closed: they see only their own inputs), and every statement's outputs agree with its shape rule."""
    if not isinstance(program, Program):
        raise TypeError(f"check_program: expected a fold Program (from fold.trace), got {type(program).__name__}")
    bound: set[Var] = set()

    def bind(var: Var, where: str) -> None:
        if var in bound:
            raise ProgramError(f"{_label}: variable {var} is bound twice ({where})")
        bound.add(var)

    for var in program.inputs:
        bind(var, "inputs")
    for i, stmt in enumerate(program.stmts):
        where = f"statement {i} ({stmt.prim.name})"
        for arg in stmt.args:
            if isinstance(arg, Var) and arg not in bound:
                raise ProgramError(f"{_label}: {where} uses the unbound variable {arg}")
        try:
            expected = shape_rules.lookup(stmt.prim)(stmt.prim, *[a.aval for a in stmt.args])
        except FoldError as err:
            raise ProgramError(f"{_label}: {where} fails its shape rule: {err}") from err
        got = [v.aval for v in stmt.outs]
        if list(expected) != got:
            raise ProgramError(f"{_label}: {where} binds {list(map(str, got))} but its shape rule gives {list(map(str, expected))}")
        for var in stmt.outs:
            bind(var, where)
        for body in stmt.prim.bodies():
            check_program(body, f"{_label} / {where} body")
    for out in program.outputs:
        if isinstance(out, Var) and out not in bound:
            raise ProgramError(f"{_label}: output {out} is unbound")
