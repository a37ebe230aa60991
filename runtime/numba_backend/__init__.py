"""The numba backend: statements lowered to compiled Numba kernels where a kernel exists, the numpy
reference implementation elsewhere."""
