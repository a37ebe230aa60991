"""Replaying a Program's statements through `bind`: inlines it into the current trace, or runs it eagerly."""

from __future__ import annotations

from typing import Any, Sequence

from .ir import Lit, Program
from .tracing import bind


def inline_program(program: Program, args: Sequence[Any]) -> list[Any]:
    """The outputs of `program` applied to `args` (tracers or arrays), each statement re-bound in turn."""
    env: dict = dict(zip(program.inputs, args, strict=True))

    def read(atom: Any) -> Any:
        return atom.value if isinstance(atom, Lit) else env[atom]

    for stmt in program.stmts:
        outs = bind(stmt.prim, *[read(a) for a in stmt.args])
        env.update(zip(stmt.outs, outs, strict=True))
    return [read(a) for a in program.outputs]
