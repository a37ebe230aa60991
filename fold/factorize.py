"""Finding the output fields of a map body that are (scalar weight) x (column data).

In gemm_map_reduce, a field that depends only on the column j (attention's v = V_j) or is a per-pair scalar
times such a field (the MLP's sigmoid(s) * Q_j) must never be broadcast to M x N x D: folding it over j is a
matrix product. `factorize` inspects the traced body and splits each such output into its weight and its
column part, so the block fold can multiply a (rows x cols) weight block by a (cols x D) column block.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dce import dce
from .ir import Lit, Program, Var
from .primitives import BroadcastTo, Elementwise, Reshape


@dataclass(frozen=True)
class Factored:
    """Output `leaf` equals weight * column, `weight` a scalar output of `pointwise` (None: weight 1)."""

    leaf: int
    weight_output: int | None


@dataclass
class Factorization:
    pointwise: Program  # body -> [full fields..., weights of factored fields...] (all per (i, j) pair)
    columns: Program  # body -> [column parts of factored fields...] (depends on column inputs only)
    full: list[int]  # output leaves computed in full per pair
    factored: list[Factored]


def _dependence(program: Program, column_inputs: set[Var]) -> dict[Var, bool]:
    """For each variable: does it depend only on column inputs (and constants)?"""
    column_only: dict[Var, bool] = {}
    for v in program.inputs:
        column_only[v] = v in column_inputs
    for stmt in program.stmts:
        ok = all(isinstance(a, Lit) or column_only[a] for a in stmt.args)
        for out in stmt.outs:
            column_only[out] = ok
    return column_only


def _producers(program: Program) -> dict[Var, object]:
    return {out: stmt for stmt in program.stmts for out in stmt.outs}


def _scalar_source(atom, producers) -> Var | None:
    """The scalar a broadcast (possibly after a reshape) comes from."""
    while isinstance(atom, Var) and atom in producers and isinstance(producers[atom].prim, (BroadcastTo, Reshape)):
        atom = producers[atom].args[0]
    if isinstance(atom, Var) and atom.aval.shape == ():
        return atom
    return None


def factorize(body: Program, column_inputs: list[Var], const_inputs: list[Var]) -> Factorization:
    column_only = _dependence(body, set(column_inputs) | set(const_inputs))
    producers = _producers(body)
    full, factored, weights, columns = [], [], [], []
    for i, out in enumerate(body.outputs):
        if isinstance(out, Lit) or out.aval.ndim == 0:
            full.append(i)
            continue
        if column_only[out]:
            factored.append(Factored(i, None))
            columns.append(out)
            continue
        stmt = producers.get(out)
        split = None
        if stmt is not None and isinstance(stmt.prim, Elementwise) and stmt.prim.op == "mul":
            for a, b in (stmt.args, stmt.args[::-1]):
                if isinstance(b, Var) and column_only[b] and b.aval.shape == out.aval.shape:
                    w = _scalar_source(a, producers)
                    if w is not None:
                        split = (w, b)
                        break
        if split is None:
            full.append(i)
        else:
            factored.append(Factored(i, len(weights)))
            weights.append(split[0])
            columns.append(split[1])
    n_full = len(full)
    factored = [Factored(f.leaf, None if f.weight_output is None else n_full + f.weight_output) for f in factored]
    pointwise = dce(Program(body.inputs, body.stmts, tuple(body.outputs[i] for i in full) + tuple(weights)))
    column_program = dce(Program(body.inputs, body.stmts, tuple(columns)))
    return Factorization(pointwise, column_program, full, factored)
