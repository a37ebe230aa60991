"""The monoid examples (examples/attention.py, pairwise.py, kmeans.py, linear_recurrence.py) run at small
sizes, and every error they return is at rounding level."""

from __future__ import annotations

import pytest
from helpers import load_example


def test_attention_example() -> None:
    errors = load_example("attention").main(m=5, n=9, f=3, d=4, verbose=False)
    assert set(errors) >= {"forward", "generic vs naive", "monoid vs naive", "generic vs monoid"}
    assert max(errors.values()) < 1e-8, errors
    assert errors["generic vs monoid"] < 1e-10, errors


def test_pairwise_example() -> None:
    errors = load_example("pairwise").main(n=30, verbose=False)
    assert {"grad loop", "grad generic", "grad monoid", "value sequential", "value parallel"} <= set(errors)
    assert max(errors.values()) < 1e-8, errors


def test_linear_recurrence_example() -> None:
    errors = load_example("linear_recurrence").main(n=20, verbose=False)
    assert errors["forward vs loop"] < 1e-12, errors
    assert max(errors.values()) < 1e-8, errors  # the gradient against central finite differences


def test_kmeans_example() -> None:
    result = load_example("kmeans").main(n=120, k=3, d=2, steps=4, verbose=False)
    history = result["history"]
    assert len(history) == 5
    assert all(b <= a + 1e-9 * abs(a) for a, b in zip(history, history[1:])), history  # cost never increases
    assert history[-1] < history[0]
    assert result["newton_vs_lloyd"] < 1e-9, result


@pytest.mark.parametrize("name", ["attention", "pairwise"])
def test_examples_print_a_rule_comparison(name: str, capsys: pytest.CaptureFixture) -> None:
    module = load_example(name)
    errors = module.main(verbose=True) if name == "pairwise" else module.main(m=3, n=5, verbose=True)
    out = capsys.readouterr().out
    assert max(errors.values()) < 1e-8
    for rule in ("auto", "generic", "monoid"):
        assert rule in out
    assert "largest difference between rules" in out
