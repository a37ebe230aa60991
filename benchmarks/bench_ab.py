"""Two commits of fold, timed alternately on the same machine: the check a change to a mechanism every program
goes through needs before it lands (issue 39: no case more than 10% slower, re-measured where it looks like
noise).

    python -m benchmarks.bench_ab BASE [--rounds R] [--only SUBSTRING] [--sets untuned,fresh,numpy] [--out NAME]

BASE is checked out into a temporary git worktree; the working tree this script runs from is "new". Each
(case, mode) runs in a fresh process per tree and round, the trees in alternating order from round to round
(base first in odd rounds), each with its own kernel caches: a first call (trace, AD, fusion, compilation),
then the warm median of `--repeats` calls. Cases are the timed programs of bench_numba, bench_ad, bench_gemm
(fold.jit on the numba backend) and bench_natural (its natural and family sets, and with --sets the others),
plus folds of a map of scalars at the top level; each tree's own benchmark modules build them, so a case must
exist under the same name in both.

The result (results/NAME.json, .png) holds every round's warm and first-call times per tree, the ratio
new / base of the medians over rounds, and whether both trees ran the same programs and kernels
(`same_programs`: a digest of every program the numba backend prepared, after its passes, with the text of
its loop nests' kernels; where they are the same, a difference in
time is the machine's noise, which on a shared 2-core machine reaches tens of percent between processes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# the package-dir mapping of pyproject.toml ("fold.ad" = "ad", ...), as symlinks in a worktree that is not installed
MAPPED = ("ad", "runtime", "kernels")


def _flat_cases() -> dict[str, Callable]:
    import fold

    M = fold.monoids
    return {
        "flat sum (a-b)^2": lambda x, y: fold.reduce(M.sum, fold.map(lambda a, b: (a - b) * (a - b), x, y)),
        "flat sum exp(a) b": lambda x, y: fold.reduce(M.sum, fold.map(lambda a, b: fold.exp(a) * b, x, y)),
        "flat max |a-b|": lambda x, y: fold.reduce(M.max, fold.map(lambda a, b: abs(a - b), x, y)),
        "flat logaddexp a b": lambda x, y: fold.reduce(M.logaddexp, fold.map(lambda a, b: a * b, x, y)),
    }


def case_names(extra_sets: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(case, mode) pairs; a case name starts with the module (or bench_natural's set) it comes from.
    `extra_sets`: bench_natural's other sets (untuned, fresh, numpy) to add."""
    from benchmarks import bench_ad, bench_gemm, bench_natural, bench_numba

    out = [(f"numba:{c.name}", m) for c in bench_numba.cases(False) if c.gemm is None for m in ("primal", "vjp")]
    out += [(f"ad:{c.name}", m) for c in bench_ad.cases() for m in ("primal", "vjp")]
    out += [(f"gemm:{layer} {json.dumps(sizes, sort_keys=True)}", m)
            for layer, sizes, big in bench_gemm.FULL_CASES if not big for m in ("primal", "vjp")]
    out += [(f"natural:{c}", m) for c in bench_natural.sizes(False) for m in bench_natural.MODES]
    out += [(f"families:{c}", m) for c in bench_natural.family_sizes(False) for m in bench_natural.MODES]
    out += [(f"flat:{c}", m) for c in _flat_cases() for m in ("primal", "vjp")]
    out += [(f"{s}:{c}", m) for s in extra_sets for c in bench_natural.SETS[s](False) for m in bench_natural.MODES]
    return out


def _callable(case: str, mode: str) -> Callable[[], Any]:
    """The call timed for (case, mode), built by the benchmark modules of the tree this process imports."""
    import fold

    source, name = case.split(":", 1)
    rng = np.random.default_rng(0)
    from benchmarks import bench_natural

    if source in bench_natural.SETS:
        args = bench_natural.inputs(name, bench_natural.SETS[source](False)[name])
        return bench_natural.program(name, "fold", mode, args)
    if source == "gemm":
        from benchmarks import bench_gemm

        layer, sizes = name.split(" ", 1)
        bench_gemm.set_backend("numba")  # bench_gemm's own default is the numpy backend
        forward, both, _ = bench_gemm.fold_functions(layer, bench_gemm.make_inputs(layer, json.loads(sizes)))
        return forward if mode == "primal" else both
    if source == "numba":
        from benchmarks import bench_numba

        (c,) = [c for c in bench_numba.cases(False) if c.name == name]
        f, args, rule = c.f, c.inputs(rng, False), c.reduce_rule
        ct = c.cotangent(rng, args)
    elif source == "ad":
        from benchmarks import bench_ad

        (c,) = [c for c in bench_ad.cases() if c.name == name]
        f, args, rule = c.f, c.inputs(rng, 1), c.reduce_rule
        ct = None
    else:
        f = _flat_cases()[name]
        args, rule, ct = tuple(rng.normal(size=10**7).astype(np.float32) for _ in range(2)), "auto", None
    if mode == "primal":
        j = fold.jit(f, backend="numba")
        return lambda: j(*args)
    if ct is None:
        ct = fold.tree_map(lambda a: np.ones_like(np.asarray(a)), fold.jit(f, backend="numba")(*args))
    j = fold.jit(lambda *a: fold.ad.vjp_value(f, a, ct, reduce_rule=rule), backend="numba")
    return lambda: j(*args)


def worker(case: str, mode: str, repeats: int) -> dict[str, Any]:
    import fold

    call = _callable(case, mode)  # which may run the primal for a cotangent: not part of what is compared
    prepared = _recording_prepare()
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    # then calls for a second, as benchmarks.common.warm_up (which the base tree's copy may not have): the
    # first calls after the first can be slower for reasons outside the program
    while time.perf_counter() - t0 < first + 1.0:
        call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return {"warm_ms": 1e3 * float(np.median(times)), "first_s": first, "fold": fold.__file__,
            "programs": digest_of(list({id(p): p for p in prepared}.values()))}


def _recording_prepare() -> list:
    """The list every program the numba backend prepares from now on (top level, gemm blocks, map bodies) is
    appended to, as it is after the backend's passes: `passes.prepare` wrapped where the backend's modules
    imported it. A jitted function prepares its program at its first call."""
    import importlib

    from fold.runtime.numba_backend import backend, passes  # noqa: F401  (imports the modules that call prepare)

    original, seen = passes.prepare, []

    def recording(program, *args, **kwargs):
        found = original(program, *args, **kwargs)
        seen.append(found)
        return found

    for name, module in list(sys.modules.items()):
        if name.startswith("fold.runtime.numba_backend") and getattr(module, "prepare", None) is original:
            setattr(importlib.import_module(name), "prepare", recording)
    return seen


def digest_of(prepared: list) -> str:
    """A digest of prepared programs, as printed, with the kernel text of each loop nest among them."""
    import hashlib

    from fold.runtime.loops import LoopNest, kernel_of
    from fold.runtime.numba_backend.loop_nests import kernel_source

    texts = []
    for program in prepared:
        texts.append(str(program))
        texts += [kernel_source(kernel_of(s.prim)) for s in program.stmts if isinstance(s.prim, LoopNest)]
    return hashlib.sha1("\n".join(sorted(texts)).encode()).hexdigest()[:16]


def _worktree(base: str, where: Path) -> Path:
    tree = where / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), base], check=True,
                   capture_output=True)
    for name in MAPPED:
        link = tree / "fold" / name
        if not link.exists():
            link.symlink_to(Path("..") / name)
    return tree


def _run(tree: Path, label: str, case: str, mode: str, repeats: int, caches: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree), FOLD_CACHE_DIR=str(caches / f"{label}_fold"),
               NUMBA_CACHE_DIR=str(caches / f"{label}_numba"))
    # this file as a script, run in the tree under test: that tree's fold and benchmark modules are imported
    # (the base tree need not have a bench_ab.py of its own)
    command = [sys.executable, str(Path(__file__)), "--worker", case, mode, str(repeats)]
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": "timeout"}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"rc {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("ratio") is not None]
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.5))
    labels = [f"{r['case']} [{r['mode']}]" for r in rows]
    colours = ["tab:gray" if r.get("same_programs") else "tab:red" if r["ratio"] > 1.1 else "tab:blue" for r in rows]
    ax.barh(range(len(rows)), [r["ratio"] for r in rows], color=colours)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(1.1, color="tab:red", lw=0.8, ls="--")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("warm time, new / base (median over rounds; < 1 is faster; grey: the same programs ran)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from benchmarks.common import RESULTS_DIR, machine, write_json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the commit to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", action="append", default=[], help="keep cases whose name contains this (repeatable)")
    parser.add_argument("--mode", action="append", default=[], help="keep only this mode (repeatable)")
    parser.add_argument("--out", default="ab")
    parser.add_argument("--sets", default="", help="bench_natural's other sets to add, comma-separated "
                                                   "(untuned, fresh, numpy)")
    args = parser.parse_args(argv)
    extra_sets = tuple(filter(None, args.sets.split(",")))
    from benchmarks import bench_natural

    unknown = [s for s in extra_sets if s not in bench_natural.SETS]
    if unknown:
        parser.error(f"--sets names {unknown}, not among bench_natural's sets {sorted(bench_natural.SETS)}")
    pairs = [(c, m) for c, m in case_names(extra_sets) if (not args.only or any(s in c for s in args.only))
             and (not args.mode or m in args.mode)]
    if not pairs:
        parser.error(f"no case matches --only {args.only} and --mode {args.mode}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="fold_ab_") as scratch:
        scratch_path = Path(scratch)
        base = _worktree(args.base, scratch_path)
        try:
            for case, mode in pairs:
                row = {"case": case, "mode": mode, "base": [], "new": []}
                for r in range(args.rounds):
                    order = [("base", base), ("new", ROOT)] if r % 2 == 0 else [("new", ROOT), ("base", base)]
                    for label, tree in order:
                        row[label].append(_run(tree, label, case, mode, args.repeats, scratch_path))
                warm = {k: [x["warm_ms"] for x in row[k] if "warm_ms" in x] for k in ("base", "new")}
                row["ratio"] = (float(np.median(warm["new"]) / np.median(warm["base"]))
                                if warm["base"] and warm["new"] else None)
                digests = {x.get("programs") for k in ("base", "new") for x in row[k]}
                row["same_programs"] = len(digests) == 1 and None not in digests
                rows.append(row)
                print(f"{case:45s} {mode:6s} base {[round(x, 1) for x in warm['base']]} new "
                      f"{[round(x, 1) for x in warm['new']]} ratio {row['ratio'] and round(row['ratio'], 2)}"
                      f"{' (same programs)' if row['same_programs'] else ''}", flush=True)
                result = {"machine": machine(), "base": args.base, "rounds": args.rounds, "repeats": args.repeats,
                          "rows": rows}
                write_json(RESULTS_DIR / f"{args.out}.json", result)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    plot(RESULTS_DIR / f"{args.out}.png", rows, f"new / base {args.base}, alternately, {machine().get('cpu', '')}")
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path[0] = os.getcwd()  # the tree under test, not this file's folder
        print(json.dumps(worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        main()
