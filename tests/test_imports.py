"""The dependency rules of the layout: `import fold` needs no backend, and kernels/ imports nothing of ours."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    """The top-level modules loaded by `code`, with fold's subpackages ad, runtime and kernels named as
    fold.ad, fold.runtime and fold.kernels."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return {".".join(m.split(".")[:2]) if m.startswith("fold.") else m.split(".")[0] for m in out.stdout.split()}


def test_import_fold_imports_no_runtime_backend_or_gpu_library():
    loaded = _modules_after("import fold")
    assert not loaded & {"fold.runtime", "fold.ad", "fold.kernels", "numba", "cupy", "hypothesis", "matplotlib"}, loaded
    assert not loaded & {"ad", "runtime", "kernels"}, loaded


def test_the_numpy_backend_needs_no_numba():
    loaded = _modules_after("import numpy as np, fold\nfold.run(lambda x: fold.reduce(fold.monoids.sum, x), np.ones(3), backend='numpy')")
    assert "fold.runtime" in loaded and not loaded & {"numba", "fold.kernels", "cupy"}, loaded
