"""`fold.compare_rules`: the same gradient computed under every reduce rule that applies, side by side.

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
from fold.primitives import Reduce
from fold.pytree import tree_flatten

from .reduce_rules import choose_rule
from .vjp import REDUCE_RULES, reduce_rule_scope, vjp_program


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
        header = f"{'rule':<9}{'reduces differentiated by':<28}{'time':>11}{'peak (est.)':>14}{'peak (meas.)':>14}{'statements':>12}"
        lines = [header, "-" * len(header)]
        for run in self.runs.values():
            lines.append(f"{run.rule:<9}{', '.join(run.reduce_rules_used) or '-':<28}{run.seconds * 1e3:>9.3f}ms"
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


def compare_rules(f: Callable[..., Any], primals: tuple, ybar: Any, *, repeats: int = 5) -> RuleComparison:
    """Run `fold.vjp(f, primals, ybar)` under each reduce rule that applies and compare them.

    >>> import numpy as np, fold
    >>> result = fold.compare_rules(lambda x: fold.reduce(fold.monoids.logaddexp, x), (np.arange(4.0),), 1.0)
    >>> sorted(result.runs)
    ['auto', 'generic', 'monoid']
    """
    import fold

    program = fold.trace(f, *primals)
    runs: dict[str, RuleRun] = {}
    for rule in REDUCE_RULES:
        try:
            with reduce_rule_scope(rule):
                grad_program, _ = vjp_program(program)
                used = sorted({choose_rule(r, rule).name for r in _reduces(program)})
        except FoldError:
            continue  # this rule does not apply to the program (the monoid rule without a d, say)
        run = fold.jit(lambda *args, _rule=rule: fold.vjp(f, args, ybar, reduce_rule=_rule))
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
        runs[rule] = RuleRun(rule, used, cotangents, float(np.median(times)), fold.memory(grad_program),
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
