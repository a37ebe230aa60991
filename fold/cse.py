"""Common-subexpression elimination in the bodies of a program's combinators.

A user who writes `tanh(sum(x * w)) * tanh(sum(x * w))` in a map body traces the product, the sum and the tanh
twice; a loop nest would then run both dot products, a whole extra pass over the row for every element of
the map. `cse(program)` keeps the first of two statements of one body that apply the same primitive to the
same arguments (statements are pure) and reads the second's results from the first's.

Only bodies are cleaned, at every depth, not the program's own top level: there a value read twice is an
array, and a fusion that joins a map to the one fold reading it (loop nests, elementwise fusion) would find
two readers where the program had one each, and store what it streamed (XLA's CSE runs before its fusion
for the same reason, keeping fusion's duplicates).

Across maps: reverse mode re-executes a scope, so the vjp of a map over a row (an MLP's hidden units) makes
again, in its own body, what the forward map over the same row already gave (tanh(x . w) per unit). A map
body value computed from the same arguments as an earlier map's result in the same body reads that result
instead (`_reuse_sibling_maps`): one row argument more, and the loops that made it again are dead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .hoist import hoist_invariants
from .ir import Let, Lit, Program, Var, with_bodies
from .primitives import Map
from .pytree import tree_flatten
from .scatter_sums import scatter_sums


def cse(program: Program) -> Program:
    """`program` with repeated statements in its combinators' bodies computed once (see the module's
    docstring), what a map in a body computes alike for every row computed before it (hoist.py), and a sum
    over a map's rows of scatter-adds as one scatter-add (scatter_sums.py); the program itself where nothing
    changes."""
    done: dict[int, tuple[Program, Program]] = {}  # a body shared by statements is cleaned once, and stays shared
    stmts = tuple(_with_clean_bodies(s, done) for s in program.stmts)
    if not all(a is b for a, b in zip(stmts, program.stmts)):
        program = dataclasses.replace(program, stmts=stmts, meta=dict(program.meta))
    return scatter_sums(hoist_invariants(program))


def cse_body(body: Program) -> Program:
    """One combinator body with its repeated statements computed once (two maps' bodies joined into one)."""
    return _body_cse(body, {})


def _with_clean_bodies(stmt: Let, done: dict) -> Let:
    return with_bodies(stmt, lambda body: _body_cse(body, done))


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
    reused = _reuse_sibling_maps(kept)
    changed |= reused is not kept
    kept = reused
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


def _reuse_sibling_maps(stmts: list[Let]) -> list[Let]:
    """The statements with each map reading, as a row argument, what an earlier map over the same rows gave
    and its body makes again; the list itself where no map does."""
    if sum(isinstance(s.prim, Map) for s in stmts) < 2:
        return stmts
    out: list[Let] = []
    ids: dict[Any, int] = {}  # each computation's number (hash-consed: a key holds numbers, not nested keys)
    given: dict[tuple[int, int], Var] = {}  # (rows, a map result's computation) -> the result
    for stmt in stmts:
        if isinstance(stmt.prim, Map):
            stmt = _reading_earlier_results(stmt, given, ids)
            keys = _canonical_keys(stmt, ids)
            if keys is not None:
                for v, o in zip(stmt.outs, stmt.prim.body.outputs, strict=True):
                    if keys.get(o) is not None:
                        given.setdefault((_rows(stmt), keys[o]), v)
        out.append(stmt)
    return stmts if all(a is b for a, b in zip(out, stmts)) else out


def _rows(stmt: Let) -> int:
    return stmt.outs[0].aval.shape[0] if stmt.outs and stmt.outs[0].aval.shape else -1


def _canonical_keys(stmt: Let, ids: dict[Any, int]) -> dict[Var, int] | None:
    """Each value of a map's body numbered by the computation it is from the outer values the map reads: a
    captured value ("const", outer), a row ("row", outer), a statement's result (its primitive, its
    arguments' numbers, its position among the results). None where a primitive cannot be compared."""
    prim, body = stmt.prim, stmt.prim.body

    def number(key: Any) -> int:
        return ids.setdefault(key, len(ids))

    keys: dict[Var, int] = {}
    for k, (v, outer) in enumerate(zip(body.inputs, stmt.args, strict=True)):
        keys[v] = number(("const" if k < prim.num_consts else "row", outer if isinstance(outer, Var) else _literal_key(outer)))
    for inner in body.stmts:
        try:
            hash(inner.prim)
        except TypeError:
            return None
        args = tuple(keys.get(a) if isinstance(a, Var) else number(_literal_key(a)) for a in inner.args)
        if any(a is None for a in args):
            return None
        for j, v in enumerate(inner.outs):
            keys[v] = number((inner.prim, args, j))
    return keys


def _reading_earlier_results(stmt: Let, given: dict[tuple[int, int], Var], ids: dict[Any, int]) -> Let:
    """The map `stmt` with every body value an earlier map gave read as a row of that map's result."""
    keys = _canonical_keys(stmt, ids) if given else None
    if keys is None:
        return stmt
    body, rows = stmt.prim.body, _rows(stmt)
    inputs = set(body.inputs)
    found = {v: given[(rows, k)] for v, k in keys.items()
             if v not in inputs and (rows, k) in given and given[(rows, k)].aval.shape[1:] == v.aval.shape}
    if not found:
        return stmt
    renamed = {v: Var(v.aval) for v in found}
    stmts = tuple(Let(s.outs, s.prim, tuple(renamed.get(a, a) if isinstance(a, Var) else a for a in s.args))
                  for s in body.stmts)
    outputs = tuple(renamed.get(o, o) if isinstance(o, Var) else o for o in body.outputs)
    new_inputs = tuple(body.inputs) + tuple(renamed[v] for v in found)
    _, in_tree = tree_flatten(tuple(range(len(new_inputs))))
    new_body = Program(new_inputs, stmts, outputs, in_tree, body.out_tree, dict(body.meta))
    return Let(stmt.outs, dataclasses.replace(stmt.prim, body=new_body), tuple(stmt.args) + tuple(found.values()))
