"""A readable, Futhark-like text for Programs: one statement a line, lambdas indented under their combinator.

    in a: f64[4,3], b: f64[3]
    let c: f64[4] = map a [captures b]
        \\ d: f64[3] | e: f64[3] ->
          let f: f64[3] = e * d
          ...
          in g
    out c

Variables get short names (a, b, ..., z, aa, ...) in order of appearance; literals print as their value.
Per-primitive print rules live in `print_rules`; the default shows `name[params] args`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .ir import Atom, Let, Program, Var
from .rules import RuleTable

print_rules = RuleTable("print")


class Namer:
    def __init__(self) -> None:
        self.names: dict[Var, str] = {}

    def __call__(self, var: Var) -> str:
        name = self.names.get(var)
        if name is None:
            name = _short_name(len(self.names))
            self.names[var] = name
        return name


def _short_name(i: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    name = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        name = letters[r] + name
    return name


def format_atom(atom: Atom, names: Namer) -> str:
    if isinstance(atom, Var):
        return names(atom)
    value = atom.value
    if value.ndim == 0:
        return repr(value.item())
    return f"const:{atom.aval}"


def _binding(var: Var, names: Namer) -> str:
    return f"{names(var)}: {var.aval}"


def _format_param(value: object) -> str:
    if isinstance(value, np.dtype):
        return value.name
    if hasattr(value, "name") and not isinstance(value, (str, tuple)):
        return str(value.name)
    return str(value)


def default_print(stmt: Let, args: list[str]) -> str:
    params = {k: v for k, v in stmt.prim.params().items() if k != "num_consts" and v is not None and v is not False}
    ptext = "[" + ", ".join(f"{k}={_format_param(v)}" for k, v in params.items()) + "]" if params else ""
    return f"{stmt.prim.name}{ptext} {' '.join(args)}".rstrip()


def print_program(program: Program, names: Namer | None = None) -> str:
    names = names or Namer()
    lines = ["in " + ", ".join(_binding(v, names) for v in program.inputs)]
    _print_stmts(program, names, lines, indent="")
    lines.append("out " + ", ".join(format_atom(a, names) for a in program.outputs))
    return "\n".join(lines)


def _print_stmts(program: Program, names: Namer, lines: list[str], indent: str) -> None:
    for stmt in program.stmts:
        args = [format_atom(a, names) for a in stmt.args]
        rule: Callable = print_rules.lookup(stmt.prim) if type(stmt.prim) in print_rules else default_print
        outs = ", ".join(_binding(v, names) for v in stmt.outs)
        lines.append(f"{indent}let {outs} = {rule(stmt, args)}")
        for body in getattr(stmt.prim, "printed_bodies", stmt.prim.bodies)():
            _print_body(body, stmt.prim.num_consts, names, lines, indent + "    ")


def _print_body(body: Program, num_consts: int, names: Namer, lines: list[str], indent: str) -> None:
    consts = ", ".join(_binding(v, names) for v in body.inputs[:num_consts])
    params = ", ".join(_binding(v, names) for v in body.inputs[num_consts:])
    head = f"{indent}\\ {consts} | {params} ->" if consts else f"{indent}\\ {params} ->"
    lines.append(head)
    _print_stmts(body, names, lines, indent + "  ")
    lines.append(f"{indent}  in " + ", ".join(format_atom(a, names) for a in body.outputs))
