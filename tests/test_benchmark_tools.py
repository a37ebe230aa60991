"""The benchmarks' own instruments, which no benchmark run would notice going blind."""

import numpy as np

import fold
from benchmarks.bench_ad import statement_profile


def test_the_statement_profile_sees_every_statement_of_a_jitted_call():
    f = fold.jit(lambda x: fold.reduce(fold.monoids.sum, fold.sin(x) * x), backend="numpy")
    x = np.linspace(0.0, 1.0, 1000)
    rows = statement_profile(lambda: f(x))
    assert {row["statement"] for row in rows} == {"sin", "mul", "reduce"}
    assert all(row["count"] == 1 and row["seconds"] > 0.0 for row in rows)
    reduce_row = next(row for row in rows if row["statement"] == "reduce")
    assert reduce_row["out_shapes"] == "[]" and reduce_row["out_bytes"] == 8
