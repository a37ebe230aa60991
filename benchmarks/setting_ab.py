"""Two values of a module's constant compared in one process: each program compiled under both, then the
calls alternated.

    PYTHONPATH=. python -m benchmarks.setting_ab module:NAME=A,B CASE MODE [CASE MODE ...] [--rounds R] [--out NAME]

CASE and MODE as bench_ab names them (`fresh:entropy grad`, `numba:4 vjp`). Prints the median ms of each
call under A and under B and their ratio. Fresh processes on the 2-core VM read identical programs 30%
apart from one hour to the next (bench_ab alternates trees to average that out over rounds); calls
alternated in one process see the same machine state, so a ratio repeats within a few percent. It compares
what a constant decides when a program is prepared or its kernels are written (a limit, a switch), not two
commits: that is bench_ab's job. `--out NAME` adds the results to results/NAME.json (every sample, the
machine) and redraws results/NAME.png.
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.common import warm_up

RESULTS = Path(__file__).resolve().parent / "results"


def parse(setting: str) -> tuple[Any, str, tuple[Any, Any]]:
    """"module:NAME=A,B" -> (the module, NAME, (A, B)), A and B Python literals."""
    try:
        target, values = setting.split("=", 1)
        module_name, attribute = target.split(":")
        first, second = (ast.literal_eval(v) for v in values.split(","))
    except (ValueError, SyntaxError) as err:
        raise SystemExit(f"setting {setting!r}: expected module:NAME=A,B with A and B Python literals ({err})")
    module = importlib.import_module(module_name)
    if not hasattr(module, attribute):
        raise SystemExit(f"setting {setting!r}: {module_name} has no {attribute}")
    return module, attribute, (first, second)


def compare(makers: dict[str, Callable[[], Callable[[], Any]]], setting: str, rounds: int = 40) -> dict[str, str]:
    """{name: "A ms / B ms (A / B)"} for each maker, which builds a fresh call (its own traced program); the
    call is made once under each value, where it compiles, and the constant is restored after."""
    return {name: f"{r['a_ms']:.2f} / {r['b_ms']:.2f} ({r['ratio']:.2f})"
            for name, r in compare_times(makers, setting, rounds).items()}


def compare_times(makers: dict[str, Callable[[], Callable[[], Any]]], setting: str,
                  rounds: int = 40) -> dict[str, dict[str, Any]]:
    """As compare, each result as numbers: {name: {a_ms, b_ms, ratio, a_samples_ms, b_samples_ms}}."""
    module, attribute, values = parse(setting)
    kept = getattr(module, attribute)
    out = {}
    for name, make in makers.items():
        calls = []
        for value in values:
            setattr(module, attribute, value)
            try:
                call = make()
                call()
            finally:
                setattr(module, attribute, kept)
            calls.append(call)
        warm_up(lambda: [call() for call in calls])
        times: tuple[list, list] = ([], [])
        for _ in range(rounds):
            for call, ts in zip(calls, times):
                start = time.perf_counter()
                call()
                ts.append(time.perf_counter() - start)
        a, b = (1e3 * float(np.median(ts)) for ts in times)
        out[name] = {"a_ms": a, "b_ms": b, "ratio": a / b,
                     "a_samples_ms": [1e3 * t for t in times[0]], "b_samples_ms": [1e3 * t for t in times[1]]}
    return out


def record(name: str, setting: str, results: dict[str, dict[str, Any]], prefix: str = "") -> Path:
    """Adds `results` (compare_times') to benchmarks/results/`name`.json, each record named `prefix` + its
    name and holding the setting, replacing a record of the same name, and redraws `name`.png (the ratios
    A / B). Returns the JSON's path."""
    from benchmarks.common import machine, plot_ratios, write_json

    path = RESULTS / f"{name}.json"
    payload = json.loads(path.read_text()) if path.exists() else {"machine": machine(), "records": []}
    added = {prefix + key: {"name": prefix + key, "setting": setting, **value} for key, value in results.items()}
    payload["records"] = [r for r in payload["records"] if r["name"] not in added] + list(added.values())
    write_json(path, payload)
    plot_ratios(path.with_suffix(".png"), payload["records"], f"{name}: A / B in one process",
                "each setting's first value (A) against its second (B), calls alternated")
    return path


def main(argv: list[str]) -> None:
    rounds, out = 40, None
    if "--rounds" in argv:
        at = argv.index("--rounds")
        rounds, argv = int(argv[at + 1]), argv[:at] + argv[at + 2:]
    if "--out" in argv:
        at = argv.index("--out")
        out, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    if len(argv) < 3 or len(argv) % 2 != 1:
        raise SystemExit(__doc__)
    from benchmarks.bench_ab import _callable

    pairs = list(zip(argv[1::2], argv[2::2]))
    makers = {f"{case} {mode}": (lambda case=case, mode=mode: _callable(case, mode)) for case, mode in pairs}
    results = compare_times(makers, argv[0], rounds)
    for name, r in results.items():
        print(f"{name:48s} {r['a_ms']:.2f} / {r['b_ms']:.2f} ({r['ratio']:.2f})", flush=True)
    if out:
        print("wrote", record(out, argv[0], results))


if __name__ == "__main__":
    main(sys.argv[1:])
