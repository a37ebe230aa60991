"""Kernel templates: compiled scalar functions and arrays in, arrays out. Blind to fold's IR.

This package imports nothing of fold, ad or runtime (only NumPy, Numba and the standard library); a test
checks it. `fold.kernels.cpu` holds the Numba CPU templates, `fold.kernels.cuda` the Numba CUDA ones (reduce, scan, their
segmented forms, histogram, map; its docstring says where their contract differs).

The contract (the same for every template):

- Elements are tuples of k >= 1 scalar leaves, stored as k arrays ("a record of arrays"): 1-D of any
  stride (the columns of an (n, k) array are read in place), or 2-D (rows, n), all of one shape: any
  strides for map and for the segmented reduce's mapper inputs (broadcast views are read as they are),
  C-contiguous for the segmented reduce's leaves. Drivers that return arrays fill the caller's `out`
  arrays (any stride) when given, so results can land in the columns of one wider array; a scan's (scan,
  map_scan, scan_pair_map) must share no memory with its inputs, which it reads again after writing, nor a
  map's with a table it gathers rows from. A 2-D map's
  input may instead be a table read through per-row indices (`rows=`): row i is the table's row g[i].
- A *combine* is a numba.njit function of 2k scalars, combine(a_0, ..., a_{k-1}, b_0, ..., b_{k-1}),
  returning a k-tuple (a scalar or a 1-tuple when k == 1) of the leaves' kinds (partial results are stored
  in the leaves' dtypes: a float result for an integer leaf is refused). It must be associative; it need
  not be commutative: every kernel keeps its operands in order, a before b.
- A *mapper* is a numba.njit function of m scalars returning a k-tuple (a scalar or 1-tuple when k == 1);
  map and scan_pair_map pass it scalar `consts` first. map_scan also takes a *post* function of the scan's
  k scalars at i and the m inputs at i (its results are written instead of the scan) and a *step*, a
  combine returning only some leaves (`live`), for the final pass.
- The *identity* is a tuple of k scalars; each must be exactly representable in its leaf's dtype.
- Element dtypes are the leaves' dtypes, or the mapper's result types (compiled for the inputs' dtypes).
- Kernels return tuples of NumPy arrays (one per leaf), or of k NumPy scalars for reduce / map_reduce.
- Host drivers (plain Python) own the thread and chunk configuration (numba.get_num_threads()), empty
  inputs (n == 0 gives the identity or empty arrays), output allocation, and the exclusive / reverse
  variants; they check their assumptions (compiled functions, contiguity, one shape, arity of
  the functions' results) and raise errors that name the values involved.
- Compiled kernels are cached in memory per (template, function objects, k, m); Numba specialises each
  on the dtypes and layouts. Kernels whose functions come from content-addressed modules are also cached
  on disk (see kernels.cpu.codegen and kernels.cpu.modules).

Entry points (kernels.cpu): reduce, map_reduce, segmented_reduce, scan, map_scan, histogram, map, map_with_row_sums, scan_pair_map, logsumexp, column_sums, product_fold, product_first_extreme.

Threads: Numba's parallel kernels run on its threading layer (OpenMP here). OpenMP's worker threads spin
for a while after each parallel region by default, which takes the cores from whatever runs next: the BLAS
threads of a matrix product between two kernels (gemm_map_reduce's block walk) ran at half speed. Importing
kernels.cpu therefore sets OMP_WAIT_POLICY=PASSIVE (threads sleep as soon as a region ends) unless the
environment sets OMP_WAIT_POLICY or GOMP_SPINCOUNT itself; it takes effect if no OpenMP runtime was started
before.
"""
