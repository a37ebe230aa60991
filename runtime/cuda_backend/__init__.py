"""The cuda backend: folds lowered to Numba CUDA kernels (kernels.cuda), on a GPU or on Numba's CUDA
simulator (NUMBA_ENABLE_CUDASIM=1). See backend.py for what runs where."""
