"""`fold.compare_rules`: the same gradient computed under every reduce rule that applies, side by side
(and, for programs with gemm_map_reduce, under its "blocks" rule beside the default "pairs").

For each rule: the cotangents, the time (median of repeats, compiled once), the peak memory (fold.memory's
estimate of the gradient program and the tracemalloc peak of one run), and the gradient program's size.
The result prints as a table, with the largest absolute and relative differences between rules.
"""

from __future__ import annotations

import time
import tracemalloc
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fold.errors import FoldError
from fold.ir import Program, count_statements
from fold.primitives import GemmMapReduce, Reduce
from fold.pytree import tree_flatten

from .reduce_rules import choose_rule
from .vjp import GEMM_RULES, REDUCE_RULES, gemm_rule_scope, reduce_rule_scope, vjp_program


@dataclass
class RuleRun:
    rule: str
    reduce_rules_used: list[str]
    cotangents: tuple
    seconds: float
    estimated_bytes: int
    measured_bytes: int
    program_size: int


@dataclass
class RuleComparison:
    runs: dict[str, RuleRun]
    max_abs_diff: float
    max_rel_diff: float

    def __getitem__(self, rule: str) -> RuleRun:
        return self.runs[rule]

    def __str__(self) -> str:
        header = f"{'rule':<13}{'reduces differentiated by':<28}{'time':>11}{'peak (est.)':>14}{'peak (meas.)':>14}{'statements':>12}"
        lines = [header, "-" * len(header)]
        for run in self.runs.values():
            lines.append(f"{run.rule:<13}{', '.join(run.reduce_rules_used) or '-':<28}{run.seconds * 1e3:>9.3f}ms"
                         f"{_mib(run.estimated_bytes):>14}{_mib(run.measured_bytes):>14}{run.program_size:>12}")
        lines.append(f"largest difference between rules: {self.max_abs_diff:.3g} absolute, {self.max_rel_diff:.3g} relative")
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def _reduces(program: Program) -> list[Reduce]:
    found = []
    for stmt in program.stmts:
        if isinstance(stmt.prim, Reduce):
            found.append(stmt.prim)
        for body in stmt.prim.bodies():
            found.extend(_reduces(body))
    return found


def _has_gemm(program: Program) -> bool:
    return any(isinstance(s.prim, GemmMapReduce) or any(_has_gemm(b) for b in s.prim.bodies()) for s in program.stmts)


def compare_rules(f: Callable[..., Any], primals: tuple, ybar: Any, *, repeats: int = 5) -> RuleComparison:
    """Run `fold.ad.vjp_value(f, primals, ybar)` under each reduce rule that applies and compare them; a program with
    gemm_map_reduce also runs under its "blocks" rule (as "gemm-blocks", reduces by "auto").

    >>> import numpy as np, fold
    >>> result = fold.compare_rules(lambda x: fold.reduce(fold.monoids.logaddexp, x), (np.arange(4.0),), 1.0)
    >>> sorted(result.runs)
    ['auto', 'generic', 'monoid']
    """
    import fold

    program = fold.trace(f, *primals)
    has_gemm = _has_gemm(program)
    settings = [(rule, rule, GEMM_RULES[0]) for rule in REDUCE_RULES] + ([("gemm-blocks", "auto", "blocks")] if has_gemm else [])
    runs: dict[str, RuleRun] = {}
    for label, rule, gemm_rule in settings:
        try:
            with reduce_rule_scope(rule), gemm_rule_scope(gemm_rule):
                grad_program, _ = vjp_program(program)
                used = sorted({choose_rule(r, rule).name for r in _reduces(program)})
        except FoldError:
            continue  # this rule does not apply to the program (the monoid rule without a d, say)
        used += [f"gemm {gemm_rule}"] if has_gemm else []
        run = fold.jit(lambda *args, _rule=rule: fold.ad.vjp_value(f, args, ybar, reduce_rule=_rule))
        with gemm_rule_scope(gemm_rule):  # the first call traces the gradient program
            cotangents = run(*primals)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run(*primals)
            times.append(time.perf_counter() - start)
        tracemalloc.start()
        run(*primals)
        measured = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        runs[label] = RuleRun(label, used, cotangents, float(np.median(times)), fold.memory(grad_program),
                              measured, count_statements(grad_program))
    max_abs, max_rel = 0.0, 0.0
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for x, y in zip(tree_flatten(runs[a].cotangents)[0], tree_flatten(runs[b].cotangents)[0], strict=True):
                diff = float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)), initial=0.0))
                scale = float(np.max(np.abs(np.asarray(y, np.float64)), initial=0.0))
                max_abs, max_rel = max(max_abs, diff), max(max_rel, diff / scale if scale else diff)
    return RuleComparison(runs, max_abs, max_rel)
