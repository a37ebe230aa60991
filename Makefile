# `make demo` and `make test` each set up .venv on first use (Python >= 3.10 and pip are all they need).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# compiled kernels are cached on disk inside the checkout (git-ignored), not in the home directory
export FOLD_CACHE_DIR ?= $(CURDIR)/.fold_cache
export NUMBA_CACHE_DIR ?= $(CURDIR)/.numba_cache
# one pytest worker per core, each test file on one worker (in its order): the numba half is mostly Numba
# compiling the suite's many small lambdas and kernels, which is single-threaded per process; the slowest
# tests are listed at the end (where CI's time goes)
PYTEST := $(PY) -m pytest tests -p no:cacheprovider -n auto --dist loadfile --durations=20

.PHONY: demo test bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,plots,dist]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# the whole suite on each backend: numba (the default), then numpy (the reference); the kernels' own tests
# and the tests comparing a backend with numpy directly do not depend on the choice and run once. The cuda
# backend's tests run on Numba's CUDA simulator unless told otherwise (NUMBA_ENABLE_CUDASIM=0 on a GPU).
test: export NUMBA_ENABLE_CUDASIM ?= 1
# check mode: each fold's identity is checked on a sample of its input at a program's first call (runtime/operator_checks.py)
test: export FOLD_CHECK ?= 1
test: $(STAMP)
	FOLD_BACKEND=numba $(PYTEST)
	FOLD_BACKEND=numpy $(PYTEST) --ignore=tests/test_kernels.py --ignore=tests/test_numba_backend.py --ignore=tests/test_vector_math.py --ignore=tests/test_gemm_backward_fusion.py --ignore=tests/test_product_fold.py --ignore=tests/test_wide_kernels.py --ignore=tests/test_one_hots.py --ignore=tests/test_first_extremes.py --ignore=tests/test_numba_captures.py --ignore=tests/test_cuda_kernels.py --ignore=tests/test_cuda_backend.py --ignore=tests/test_cuda_ptx.py --ignore=tests/test_cuda_loop_nests.py --ignore=tests/test_cuda_gemm.py --ignore=tests/test_wheel.py --ignore=tests/test_cli.py --ignore=tests/test_compile_feedback.py --ignore=tests/test_loop_nests.py --ignore=tests/test_nest_interchange.py --ignore=tests/test_copy_propagation.py --ignore=tests/test_cuda_residency.py --ignore=tests/test_faults.py --ignore=tests/test_dask_sharding.py --ignore=tests/test_broadcast_maps.py --ignore=tests/test_loop_maps.py --ignore=tests/test_sibling_maps.py --ignore=tests/test_outer_products.py

# the docs site, built --strict into site/ (git-ignored); the docs extra is installed on first use
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: export NO_MKDOCS_2_WARNING = 1
docs: $(DOCS_STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) .numba_cache .fold_cache .hypothesis site build/api_source
