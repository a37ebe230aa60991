"""Loop nests: the backend-neutral form that fused statements take (nest.py), how fold's statements are
written as one (build.py), the fusion pass that decides which statements become one (fusion.py), the
dead temporaries a built nest sheds (prune.py), and NumPy-style broadcasting written as the maps it stands
for, so that the fusion pass sees it (broadcast_maps.py)."""

from .broadcast_maps import broadcasts_as_maps
from .fusion import LoopNest, constants_of, fuse_loop_nests, kernel_of
from .nest import Kernel, describe

__all__ = ["Kernel", "broadcasts_as_maps", "LoopNest", "constants_of", "describe", "fuse_loop_nests", "kernel_of"]
