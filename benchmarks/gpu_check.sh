#!/usr/bin/env bash
# The checks that need a real GPU, in one run of a few minutes (the device tool's machine, or any CUDA box):
# benchmarks/gpu_ab.py (the launch mechanisms on and off), the cuda tests with NUMBA_ENABLE_CUDASIM=0, then
# benchmarks/bench_cuda.py and gpu_profile_gemm.py. Logs and results go to $OUT
# (the device tool's folder that comes back) or ./gpu_check_out.
#
# The device image has NumPy 2.5 beside numba-cuda 0.30.4, which cannot compile with it; a NumPy 2.4 wheel in
# .whl/ (see benchmarks/README.md) is installed first on PYTHONPATH. The image's stack is tried once as it is,
# to record what a user with that stack sees.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FOLD_CACHE_DIR=/tmp/fold_cache NUMBA_CACHE_DIR=/tmp/numba_cache NUMBA_ENABLE_CUDASIM=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { cat /tmp/install.log; exit 1; }

echo "== the image's own stack (numpy $(python3 -c 'import numpy; print(numpy.__version__)'))"
timeout 120 python3 -c "
import numpy as np, fold
try:
    print(fold.jit(lambda x: fold.reduce(lambda a, b: a + b * a, x, identity=0.0), backend='cuda')(np.ones(10)))
except Exception as err:
    print(type(err).__name__, err)
" 2>&1 | tail -5

if ls .whl/numpy-2.4*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/numpy-2.4*.whl
  export PYTHONPATH=/tmp/site
fi
python3 -c "from importlib.metadata import version as v; import numpy; print('numpy', numpy.__version__, *(f'{d} {v(d)}' for d in ('numba', 'numba-cuda', 'cupy-cuda13x')))" | tee -a "$OUT/gpu.txt"

echo "== the launch mechanisms on and off (benchmarks/gpu_ab.py)"
timeout ${AB_SECONDS:-150} python3 -m benchmarks.gpu_ab 2>&1 | tee /tmp/gpu_ab.log | tail -12

echo "== cuda tests on the GPU"
timeout ${TEST_SECONDS:-240} python3 -m pytest tests/test_cuda_kernels.py tests/test_cuda_backend.py tests/test_cuda_residency.py tests/test_cuda_ptx.py tests/test_cuda_loop_nests.py tests/test_cuda_gemm.py \
  -p no:cacheprovider -q -n 8 --tb=short -W ignore::numba.core.errors.NumbaPerformanceWarning 2>&1 | tee "$OUT/cuda_tests.log" | tail -40

echo "== bench_cuda"
timeout ${BENCH_SECONDS:-240} python3 -m benchmarks.bench_cuda --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_cuda.log" | tail -30

echo "== where gemm_map_reduce's time goes (benchmarks/gpu_profile_gemm.py)"
timeout ${PROFILE_SECONDS:-150} python3 -m benchmarks.gpu_profile_gemm 2>&1 | tee /tmp/profile_gemm.log | tail -8
