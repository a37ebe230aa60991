"""Loop nests: the backend-neutral form that fused statements take (nest.py), how fold's statements are
written as one (build.py), the fusion pass that decides which statements become one (fusion.py), and the
dead temporaries a built nest sheds (prune.py)."""

from .fusion import LoopNest, constants_of, fuse_loop_nests, kernel_of
from .nest import Kernel, describe

__all__ = ["Kernel", "LoopNest", "constants_of", "describe", "fuse_loop_nests", "kernel_of"]
