"""Sharded execution on Dask: `fold.shard(f, split=..., chunks=..., client=...)`.

A fold program runs over a `distributed.Client`: arguments split along an axis live as chunks on the
workers, maps and elementwise code run where the chunks live (each run of shard-local statements fused into
one shard program, one task per chunk: fusion.py), reduce / scan /
reduce_by_index / gemm_map_reduce fold each chunk where it lives and combine the partial states with the
operator in order, in a tree. Gradients are programs too (`fold.shard(fold.value_and_grad(f), ...)`), so
they shard by the same rules. Importing `fold` never imports this package (nor Dask).
"""

from __future__ import annotations

from .api import Sharded, shard
from .spec import ShardingError

__all__ = ["Sharded", "ShardingError", "shard"]
