"""Run every benchmark module (benchmarks/bench_*.py), in name order, by calling its `main(argv)`.

    python -m benchmarks.run_all            # what `make bench` runs
    python -m benchmarks.run_all --quick    # the arguments are passed on to every module's main()

A module that fails is reported and the others still run; the exit status is 1 if any failed.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
import traceback
from pathlib import Path


def bench_modules() -> list[str]:
    here = Path(__file__).resolve().parent
    return sorted(f"{__package__ or 'benchmarks'}.{m.name}" for m in pkgutil.iter_modules([str(here)])
                  if m.name.startswith("bench_"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    failed = []
    for name in bench_modules():
        print(f"== {name} {' '.join(argv)}".rstrip(), flush=True)
        start = time.perf_counter()
        try:
            importlib.import_module(name).main(list(argv))
        except SystemExit as exc:  # argparse errors, or a module that exits on purpose
            if exc.code not in (0, None):
                failed.append(name)
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"== {name}: {time.perf_counter() - start:.1f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
