"""Common-subexpression elimination in the bodies of a program's combinators.

A user who writes `tanh(sum(x * w)) * tanh(sum(x * w))` in a map body traces the product, the sum and the tanh
twice; a loop nest would then run both dot products, a whole extra pass over the row for every element of
the map. `cse(program)` keeps the first of two statements of one body that apply the same primitive to the
same arguments (statements are pure) and reads the second's results from the first's.

Only bodies are cleaned, at every depth, not the program's own top level: there a value read twice is an
array, and a fusion that joins a map to the one fold reading it (loop nests, elementwise fusion) would find
two readers where the program had one each, and store what it streamed (XLA's CSE runs before its fusion
for the same reason, keeping fusion's duplicates).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .ir import Let, Lit, Program, Var


def cse(program: Program) -> Program:
    """`program` with repeated statements in its combinators' bodies computed once (see the module's
    docstring); the program itself where nothing repeats."""
    done: dict[int, tuple[Program, Program]] = {}  # a body shared by statements is cleaned once, and stays shared
    stmts = tuple(_with_clean_bodies(s, done) for s in program.stmts)
    if all(a is b for a, b in zip(stmts, program.stmts)):
        return program
    return dataclasses.replace(program, stmts=stmts, meta=dict(program.meta))


def _with_clean_bodies(stmt: Let, done: dict) -> Let:
    prim = stmt.prim
    if not prim.body_fields:
        return stmt
    bodies = {f: _body_cse(getattr(prim, f), done) for f in prim.body_fields}
    if all(bodies[f] is getattr(prim, f) for f in prim.body_fields):
        return stmt
    return Let(stmt.outs, dataclasses.replace(prim, **bodies), stmt.args)


def _body_cse(body: Program, done: dict) -> Program:
    """One body with its repeats dropped (its own bodies first)."""
    if id(body) in done:
        return done[id(body)][1]
    seen: dict[Any, tuple[Var, ...]] = {}
    rename: dict[Var, Var] = {}
    kept: list[Let] = []
    changed = False
    for stmt in body.stmts:
        cleaned = _with_clean_bodies(stmt, done)
        args = tuple(rename.get(a, a) if isinstance(a, Var) else a for a in cleaned.args)
        changed |= cleaned is not stmt or args != cleaned.args
        key = _key(cleaned.prim, args)
        earlier = seen.get(key) if key is not None else None
        if earlier is not None and len(earlier) == len(cleaned.outs):
            rename.update(zip(cleaned.outs, earlier))
            changed = True
            continue
        if key is not None:
            seen[key] = cleaned.outs
        kept.append(cleaned if args == cleaned.args else Let(cleaned.outs, cleaned.prim, args))
    outputs = tuple(rename.get(o, o) if isinstance(o, Var) else o for o in body.outputs)
    cleaned_body = dataclasses.replace(body, stmts=tuple(kept), outputs=outputs, meta=dict(body.meta)) if changed else body
    done[id(body)] = (body, cleaned_body)
    return cleaned_body


def _key(prim, args: tuple) -> Any:
    """What two statements computing the same values share, or None where it cannot be told (an unhashable
    field). A primitive with bodies compares them by identity: two traces of one lambda are not merged."""
    try:
        hash(prim)
    except TypeError:
        return None
    return prim, tuple(a if isinstance(a, Var) else _literal_key(a) for a in args)


def _literal_key(lit: Lit) -> Any:
    value = lit.value
    return "lit", value.dtype.str, value.shape, value.tobytes()
