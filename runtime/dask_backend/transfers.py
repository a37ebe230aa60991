"""Bytes Dask moved between workers for one call, read from the workers' own transfer logs.

Every task of a call has a key starting with the call's prefix (context.py); a worker's
`transfer_incoming_log` records, per transfer from another worker, the keys it fetched and their sizes.
Summing those of the call's keys over all workers gives the bytes moved between workers (the client's
inputs and the final gather are not transfers between workers and are not counted).
"""

from __future__ import annotations

from typing import Any


def _incoming(dask_worker: Any, prefix: str, keys: frozenset = frozenset(), since: float = 0.0) -> int:
    return int(sum(size for entry in dask_worker.transfer_incoming_log for key, size in entry["keys"].items()
                   if str(key).startswith(prefix) or (key in keys and entry["stop"] >= since)))


def bytes_moved(client: Any, prefix: str, keys: set | frozenset = frozenset(), since: float = 0.0) -> int:
    """Bytes of the call's task results fetched by one worker from another, summed over the workers; and
    of the resident inputs it read (`keys`, which earlier calls made) fetched since `since` (the time.time()
    of the call's start: the workers' clocks, which are this machine's on a LocalCluster)."""
    return sum(client.run(_incoming, prefix=prefix, keys=frozenset(keys), since=since).values())
