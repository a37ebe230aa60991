"""The runnable examples run, and what they print agrees with NumPy."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import assert_close, load_example, run_checked



def test_demo_main_runs_and_its_numbers_agree(capsys: pytest.CaptureFixture) -> None:
    demo = load_example("demo")
    demo.main(big=2000, m=64)  # the comparison sections at a small size, to keep the suite fast
    out = capsys.readouterr().out
    fold_value = float(re.search(r"fold\.run\s*=\s*([-\d.e]+)", out).group(1))
    numpy_value = float(re.search(r"np\.prod\(xs @ w\)\s*=\s*([-\d.e]+)", out).group(1))
    assert fold_value == pytest.approx(numpy_value, rel=1e-10)
    scan_line = re.search(r"scan: \[([^\]]*)\]", out).group(1).split()
    loop_line = re.search(r"loop: \[([^\]]*)\]", out).group(1).split()
    assert scan_line == loop_line and len(scan_line) == 8
    # every error or difference the demo reports is at rounding level
    reported = [float(v) for v in re.findall(r"(?:largest error[^:]*|largest difference between rules): ([-\d.e+]+)", out)]
    assert reported and max(reported) < 1e-8, reported


def test_demo_functions_against_numpy() -> None:
    demo = load_example("demo")
    rng = np.random.default_rng(1)
    xs, w = rng.uniform(0.5, 1.5, (9, 4)), rng.uniform(0.5, 1.5, 4)
    assert_close(run_checked(demo.weighted_product, xs, w), np.prod(xs @ w))
    a, b = rng.uniform(0.5, 1.0, 17), rng.normal(size=17)
    expected, x = [], 0.0
    for at, bt in zip(a, b):
        x = at * x + bt
        expected.append(x)
    assert_close(run_checked(demo.linear_recurrence, a, b), np.array(expected))
