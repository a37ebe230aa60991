"""Numba's disk cache and fold's kernel sources (kernels/cpu/cache_stamp.py): a cached compilation of a
kernel is used again while fold's kernel sources are unchanged, and not once any of them changes (Numba
alone looks only at the file of the function it compiled)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from fold.kernels import cpu  # noqa: F401 (installs the locators)
from fold.kernels.cpu import cache_stamp, modules

ROOT = Path(__file__).resolve().parents[1]

# Runs logsumexp in a fresh process on the cache in argv[1], with the sources digest replaced by argv[2]
# when given (as if fold's kernel sources had changed), and prints the kernel's cache hits and misses.
CHILD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("fold.kernels.cpu.cache_stamp", "kernels/cpu/cache_stamp.py")
stamp = importlib.util.module_from_spec(spec)
sys.modules["fold.kernels.cpu.cache_stamp"] = stamp
spec.loader.exec_module(stamp)
if len(sys.argv) > 2:
    stamp.sources_digest = lambda: sys.argv[2]
import numpy as np
import fold.kernels.cpu as kc
from fold.kernels.cpu.logsumexp import _KERNELS
kc.logsumexp(np.arange(10.0), chunks=1)
stats = _KERNELS[False].stats
print(json.dumps([sum(stats.cache_hits.values()), sum(stats.cache_misses.values())]))
"""


def _run_child(cache: Path, *digest: str) -> list[int]:
    env = {"NUMBA_CACHE_DIR": str(cache), "FOLD_CACHE_DIR": "", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(cache), *digest], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cached_kernel_is_reused_until_the_kernel_sources_change(tmp_path):
    assert _run_child(tmp_path) == [0, 1]  # compiled and saved
    assert _run_child(tmp_path) == [1, 0]  # loaded
    assert _run_child(tmp_path, "as if vector_math.py had changed") == [0, 1]  # stale: compiled again


def test_which_files_are_stamped(tmp_path):
    assert cache_stamp.is_stamped(str(ROOT / "kernels" / "cpu" / "logsumexp.py"))
    assert cache_stamp.is_stamped(str(ROOT / "runtime" / "numba_backend" / "codegen.py"))
    assert cache_stamp.is_stamped("/anywhere/" + modules.PREFIX + "0123abcd.py")
    assert not cache_stamp.is_stamped(np.__file__)
    assert cache_stamp.GENERATED_PREFIX == modules.PREFIX
    (tmp_path / "checkout").symlink_to(ROOT, target_is_directory=True)  # a checkout reached by a link
    assert cache_stamp.is_stamped(str(tmp_path / "checkout" / "kernels" / "cpu" / "logsumexp.py"))


def test_the_digest_covers_every_kernel_source():
    files = {p.relative_to(ROOT).as_posix() for folder in cache_stamp.SOURCE_FOLDERS for p in folder.rglob("*.py")}
    assert {"kernels/cpu/vector_math.py", "kernels/cpu/logsumexp.py", "runtime/numba_backend/codegen.py"} <= files
    assert len(cache_stamp.sources_digest()) == 64
    assert cache_stamp.install()  # installed once, idempotent
    locators = cache_stamp.cache_impl()._locator_classes
    stamped = [c for c in locators if issubclass(c, cache_stamp._StampedLocator)]
    assert len(stamped) == 3 and locators[:3] == stamped
