"""The `fold` command (also `python -m fold`): `info`, `demo`, `bench --quick`, `cache clear`.

It imports what each subcommand needs when that subcommand runs, so `fold --help` is quick and `fold info`
works where a backend's dependencies are missing (it says so instead).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence


def checkout_root() -> Path | None:
    """The repository this fold runs from, when it runs from a checkout (an editable install or the source
    tree itself): the folder above the package, holding fold's pyproject.toml and benchmarks/. None for an
    installed wheel."""
    root = Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if not (pyproject.is_file() and (root / "benchmarks" / "run_all.py").is_file()):
        return None
    return root if 'name = "fold"' in pyproject.read_text() else None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _info(_args: argparse.Namespace) -> int:
    import fold

    print(f"fold {fold.__version__} (Python {sys.version.split()[0]}, {Path(fold.__file__).parent})")
    root = checkout_root()
    print(f"checkout: {root if root is not None else 'none (an installed package)'}")
    from fold.runtime.backends import available_backends, get_backend

    print(f"backends: {', '.join(available_backends())}; default: {get_backend().name} "
          f"(FOLD_BACKEND={os.environ.get('FOLD_BACKEND')!r})")
    try:
        import numba
    except ImportError as err:
        print(f"numba: not importable ({err})")
        return 0
    print(f"numba {numba.__version__}: {numba.config.NUMBA_NUM_THREADS} threads "
          f"(NUMBA_NUM_THREADS; {os.cpu_count()} CPUs)")
    print(f"cuda: {_cuda_status()}")
    from fold.runtime.numba_backend.cache_files import cache_folders, size

    folders = cache_folders()
    if not any(f.generated_only for f in folders):
        print("kernel cache: off (FOLD_CACHE_DIR is empty): kernels are compiled in every process")
    for folder in folders:
        files = folder.files()
        if files or folder.generated_only:
            print(f"cache: {folder.what}: {folder.path}: {len(files)} files, {_mib(size(files))}")
    return 0


def _cuda_status() -> str:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): the cuda backend runs on the CPU"
    try:
        from numba import cuda
    except ImportError as err:
        return f"numba.cuda not importable ({err}); the cuda backend needs the gpu extra"
    try:
        if cuda.is_available():
            name = cuda.get_current_device().name
            return f"a GPU: {name.decode() if isinstance(name, bytes) else name}"
    except Exception as err:  # a driver that fails to load is reported, not raised
        return f"no GPU usable ({type(err).__name__}: {err})"
    return "no GPU found (NUMBA_ENABLE_CUDASIM=1 runs the cuda backend on Numba's simulator)"


def _demo(args: argparse.Namespace) -> int:
    from fold.demo import main

    main(n=args.rows, d=args.features)
    return 0


def _bench(args: argparse.Namespace) -> int:
    root = checkout_root()
    if root is None:
        print("fold bench: the benchmarks live in fold's repository, not in the installed package; run it from "
              "a checkout (make bench, or python -m benchmarks.run_all --quick there)", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "benchmarks.run_all", *(["--quick"] if args.quick else [])]
    print(f"fold bench: {' '.join(command[1:])} in {root}", flush=True)
    return subprocess.run(command, cwd=root).returncode


def _cache_clear(_args: argparse.Namespace) -> int:
    from fold.runtime.numba_backend.cache_files import cache_folders, clear

    count, freed = clear()
    print(f"fold cache clear: removed {count} files ({_mib(freed)}) of fold's kernel cache from:")
    for folder in cache_folders():
        if folder.path.is_dir():
            print(f"  {folder.path}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="fold", description="fold, a differentiable array language: tools.")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("info", help="version, backends and devices, cache folders and their sizes").set_defaults(run=_info)
    demo = commands.add_parser("demo", help="a small demo: a program traced, run and differentiated, checked against NumPy")
    demo.add_argument("--rows", type=int, default=6, help="rows of the demo's input (default 6)")
    demo.add_argument("--features", type=int, default=3, help="features per row (default 3)")
    demo.set_defaults(run=_demo)
    bench = commands.add_parser("bench", help="the benchmarks (benchmarks.run_all; needs a checkout)")
    bench.add_argument("--quick", action="store_true", help="every benchmark at 100x smaller sizes (a smoke test)")
    bench.set_defaults(run=_bench)
    cache = commands.add_parser("cache", help="fold's compiled-kernel cache")
    cache_commands = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    cache_commands.add_parser("clear", help="remove fold's cached kernels (nothing else)").set_defaults(run=_cache_clear)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit status."""
    args = parser().parse_args(argv)
    return args.run(args)
