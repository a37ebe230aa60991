"""Inputs resident on the workers across calls: an array already sent is not sent again.

A sharded function keeps, per input array it has placed, the Dask futures of its placement (the scattered
chunks of a split input, the copy on each worker of a whole one) for as long as the array lives (a weak
reference: when the caller drops the array, the futures are released and the workers free its memory).
On the next call the same array object reuses those futures only if its contents are unchanged: its
buffer address, shape, strides and dtype are compared, and the whole of its bytes hashed (SHA-256, about
0.7 s per GB on one core of this machine, which has SHA extensions; sending the GB again was most of a
4.6 s per-call overhead here), so an array mutated in place between calls is sent again, never silently
stale.

Values the client makes itself (an iota, a literal's broadcast) are new objects every call: they are kept
by their contents alone (the digest names them), a few at a time.

Placement uses Dask's own transport: `client.scatter` (one key per chunk, on the chunk's worker; a whole
value scattered to every worker, a key per worker), straight to the workers (`direct`). Scattered data
cannot be recomputed by Dask: a worker lost with a chunk loses it, its dependents are cancelled, and
`Sharded.__call__` drops the lost placements and runs the call again, which sends those chunks anew (a
lost worker costs a rerun, never a wrong result).
"""

from __future__ import annotations

import hashlib
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

CONSTANTS_KEPT = 16  # client-made values kept by contents (per sharded function)


def digest(array: np.ndarray) -> bytes:
    """SHA-256 of `array`'s bytes in C order (its dtype and shape are compared apart)."""
    data = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    return hashlib.sha256(data.reshape(-1).view(np.uint8)).digest()


def fingerprint(array: np.ndarray) -> tuple:
    """What must be equal, besides the bytes, for an array to be the one placed: buffer, shape, layout, dtype."""
    return (array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)


@dataclass
class _Entry:
    ref: Any                      # weakref to the array (None for a client-made value, kept by contents)
    fingerprint: tuple
    digest: bytes
    placements: dict = field(default_factory=dict)   # placement key -> futures
    used: dict = field(default_factory=dict)         # placement key -> the call that last read it


class Resident:
    """The placements of one sharded function's inputs on its client's workers, kept across calls."""

    def __init__(self, client: Any):
        self.client = client
        self._by_id: dict[int, _Entry] = {}
        self._constants: OrderedDict[tuple, _Entry] = OrderedDict()
        self.sent = 0          # bytes scattered since the last `reset_counts` (the client's sends of inputs)
        self.hashed = 0        # bytes hashed since then
        self.used_keys: set[str] = set()  # the keys of the placements read since then
        self._call = 0

    def reset_counts(self) -> None:
        """Start a call: its counts from zero."""
        self.sent, self.hashed, self.used_keys = 0, 0, set()
        self._call += 1

    def clear(self) -> None:
        """Forget every placement (its futures released): the next call sends everything again."""
        self._by_id.clear()
        self._constants.clear()

    def drop_lost(self) -> int:
        """Forget placements with a future that is not in memory any more (its worker was lost); how many."""
        lost = 0
        for entry in list(self._by_id.values()) + list(self._constants.values()):
            for key, futures in list(entry.placements.items()):
                if any(f.status != "finished" for f in futures):
                    del entry.placements[key]
                    lost += 1
        return lost

    # ------------------------------------------------------------------ lookup

    def _input_entry(self, array: np.ndarray) -> _Entry:
        """The entry of an input array, checked against its current contents (a new, empty one if changed)."""
        entry = self._by_id.get(id(array))
        fp = fingerprint(array)
        self.hashed += array.nbytes
        now = digest(array)
        if entry is not None and entry.ref() is array and entry.fingerprint == fp and entry.digest == now:
            return entry
        key = id(array)
        entry = _Entry(weakref.ref(array, lambda _, key=key: self._forget(key)), fp, now)
        self._by_id[key] = entry
        return entry

    def _forget(self, key: int) -> None:
        entry = self._by_id.get(key)
        if entry is not None and entry.ref() is None:
            del self._by_id[key]

    def _constant_entry(self, array: np.ndarray, placement: tuple) -> _Entry:
        self.hashed += array.nbytes
        key = (digest(array), array.shape, array.dtype.str) + placement
        entry = self._constants.get(key)
        if entry is None:
            entry = self._constants[key] = _Entry(None, fingerprint(array), key[0])
            while len(self._constants) > CONSTANTS_KEPT:
                self._constants.popitem(last=False)
        self._constants.move_to_end(key)
        return entry

    # ------------------------------------------------------------------ placements

    def whole(self, array: np.ndarray, workers: Sequence[str]) -> dict[str, Any]:
        """Per worker, a future of its own copy of `array` (scattered once while unchanged). One key per
        worker, not one key broadcast: Dask's active memory manager drops the extra replicas of a key that
        no waiting task needs, which made every call fetch the whole inputs again between workers."""
        entry = self._input_entry(array)
        placement = ("whole", tuple(workers))
        futures = entry.placements.get(placement)
        if futures is None or any(f.status != "finished" for f in futures):
            self._drop_unused(entry)
            name = f"fold-input-{uuid.uuid4().hex[:12]}"
            futures = [self.client.scatter({f"{name}-{w}": array}, workers=[w], hash=False, direct=direct(self.client))[f"{name}-{w}"]
                       for w in workers]
            entry.placements[placement] = futures
            self.sent += array.nbytes * len(workers)
        entry.used[placement] = self._call
        self.used_keys.update(f.key for f in futures)
        return dict(zip(workers, futures, strict=True))

    def chunks(self, array: np.ndarray, axis: int, chunks: tuple[int, ...], owners: Sequence[str],
               constant: bool = False) -> list:
        """Futures of `array` cut along `axis` into `chunks`, chunk k on `owners[k]` (scattered once while
        unchanged). `constant`: a value the client made this call, kept by its contents, not its identity."""
        placement = ("split", axis, tuple(chunks), tuple(owners))
        entry = self._constant_entry(array, placement) if constant else self._input_entry(array)
        futures = entry.placements.get(placement)
        if futures is None or any(f.status != "finished" for f in futures):
            self._drop_unused(entry)
            name = f"fold-input-{uuid.uuid4().hex[:12]}"
            offsets = np.cumsum((0,) + tuple(chunks))
            futures = []
            for k, (a, b, w) in enumerate(zip(offsets[:-1], offsets[1:], owners, strict=True)):
                piece = _take(array, axis, int(a), int(b))
                futures.append(self.client.scatter({f"{name}-{k}": piece}, workers=[w], hash=False,
                                                   direct=direct(self.client))[f"{name}-{k}"])
                self.sent += piece.nbytes
            entry.placements[placement] = futures
        entry.used[placement] = self._call
        self.used_keys.update(f.key for f in futures)
        return futures

    def _drop_unused(self, entry: _Entry) -> None:
        """Before placing an array anew, forget its placements this call does not read (another chunking,
        a cluster that changed): their futures would keep a second copy of it on the workers."""
        for key in [k for k in entry.placements if entry.used.get(k) != self._call]:
            del entry.placements[key]


def direct(client: Any) -> bool:
    """Whether the client sends inputs to (and gathers results from) the workers directly: the client's own
    `direct_to_workers` when it was set, else True. Through the scheduler (Dask's default) a 537 MB chunk
    took 5.4 s to gather here against 0.4-0.6 s directly: the scheduler receives it and sends it on. Make
    the client with `Client(..., direct_to_workers=False)` where it can reach only the scheduler."""
    chosen = getattr(client, "direct_to_workers", None)
    return True if chosen is None else bool(chosen)


def _take(array: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * array.ndim
    index[axis] = slice(start, stop)
    return np.ascontiguousarray(array[tuple(index)])
