"""Walking a Program over placements: each statement runs by its sharded rule when an operand is split,
or whole on one worker (where its first operand lives) when none is."""

from __future__ import annotations

from fold.ir import Let, Program, Var

from . import fold_rules, gemm_rules, tasks  # noqa: F401  (fold_rules and gemm_rules register their rules)
from .context import Context, literal
from .placement import Rep, Split
from .rules import refuse, shard_rules


def run_sharded(ctx: Context, program: Program, inputs: list) -> list:
    """The placements of `program`'s outputs, its inputs placed as `inputs` (Rep or Split each)."""
    env = dict(zip(program.inputs, inputs, strict=True))
    last_use = _last_uses(program)
    for index, stmt in enumerate(program.stmts):
        args = [env[a] if isinstance(a, Var) else literal(a.value) for a in stmt.args]
        split = next((i for i, a in enumerate(args) if isinstance(a, Split)), None)
        if split is None:
            outs = _whole(ctx, index, stmt, args)
        else:
            rule = shard_rules.get(stmt.prim)
            if rule is None:
                raise refuse(index, stmt, split, args[split], f"{stmt.prim.name} has no sharded rule")
            outs = rule(ctx, index, stmt, args)
        env.update(zip(stmt.outs, outs, strict=True))
        for var in [v for v in env if last_use.get(v, -1) <= index]:  # dead: its shard values need not leave
            del env[var]                                                # their shard program (fusion.py)
        del args, outs
    outputs = [env[a] if isinstance(a, Var) else literal(a.value) for a in program.outputs]
    ctx.flush_all()
    return outputs


def _last_uses(program: Program) -> dict:
    """Per variable, the index of the last statement reading it (the program's outputs: never dead)."""
    last: dict = {}
    for index, stmt in enumerate(program.stmts):
        for a in stmt.args:
            if isinstance(a, Var):
                last[a] = index
    for a in program.outputs:
        if isinstance(a, Var):
            last[a] = len(program.stmts)
    return last


def _whole(ctx: Context, index: int, stmt: Let, args: list) -> list[Rep]:
    if not any(isinstance(a, Var) for a in stmt.args) and not stmt.prim.bodies():  # iota, a literal's broadcast:
        values = tasks.run_primitive(stmt.prim, *[a.value for a in args])  # made on the client, so a split use
        return [Rep(v, out.aval) for v, out in zip(values, stmt.outs, strict=True)]  # sends each worker its piece
    worker = next((a.worker for a in args if a.worker), ctx.workers[0])
    futures = ctx.run(index, "whole", stmt.prim, stmt.args, [a.on(worker) for a in args], [a.aval for a in args],
                      worker, len(stmt.outs))
    return [Rep(f, out.aval, worker) for f, out in zip(futures, stmt.outs, strict=True)]
