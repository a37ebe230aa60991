"""Replaying a Program's statements through `bind`: inlines it into the current trace, or runs it eagerly; and
splicing a traced function's statements into a program a rewrite is building."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .ir import Let, Lit, Program, Var
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


def spliced(fn: Callable, atoms: Sequence[Any]) -> tuple[list[Let], list[Any]]:
    """The statements of `fn` traced on values shaped like `atoms`, reading those atoms, and its outputs: what
    a rewrite writes in place of statements it replaces (a one-hot's reader, a scatter-add's entries)."""
    from .api import trace  # api imports the transformations that splice

    traced = trace(fn, *[np.zeros(a.aval.shape, a.aval.dtype) for a in atoms])
    rename = dict(zip(traced.inputs, atoms, strict=True))

    def sub(a: Any) -> Any:
        return rename.get(a, a) if isinstance(a, Var) else a

    return [Let(s.outs, s.prim, tuple(sub(a) for a in s.args)) for s in traced.stmts], [sub(o) for o in traced.outputs]
