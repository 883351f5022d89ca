"""``KeyWindow``: the idempotency keys a writer recognises, and the appends waiting on a key.

Keys live in the log itself, in each fragment's footer, so the window survives restarts and
fail-overs: on the first keyed append after a log is opened the writer reads the footers of the
last ``idempotency.window_fragments`` sequence numbers, and keys of fragments linked by read
repair or by another writer are learned as they appear.  In memory the window is bounded by
configuration, never by traffic: keys are forgotten when their fragment leaves the window, at
most ``idempotency.window_keys`` are kept whole, and up to ``idempotency.spill_keys`` more as a
hash pointing at their fragment's footer.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable

from .appends import AppendResult
from .errors import CorruptFragment, ObjectNotFound
from .fragment import KeyEntry, key_digest, read_keys
from .options import IdempotencyOptions
from .paths import fragment_path, join
from .store import ObjectStore


class KeyWindow:
    """The dedup window of one log: keys answered from memory, from a footer (spilled), or by
    waiting for the first append with the key (concurrent duplicates)."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        options: IdempotencyOptions,
        stats: collections.Counter[str],
        next_seq_no: Callable[[], int],
        on_learned: Callable[[], None],
    ) -> None:
        """``next_seq_no`` gives the tail of the manifest the writer holds (the window ends
        there); ``on_learned`` runs after keys were learned from footers, to settle queued
        appends whose key turned out to be in the log already."""
        self._store = store
        self._prefix = prefix
        self._opts = options
        self._stats = stats
        self._next_seq_no = next_seq_no
        self._on_learned = on_learned
        self._keys: collections.OrderedDict[str, AppendResult] = collections.OrderedDict()
        self._key_seq: dict[str, int] = {}  # the fragment each key is in, to expire the window
        # hash(key) -> fragment, for keys past window_keys still in the fragment window.
        self._spill: dict[int, int] = {}
        self._loaded = False
        self._unlearned: set[int] = set()  # sequence numbers whose footers we still must read
        self._lock = asyncio.Lock()
        self._waiters: dict[str, asyncio.Future[AppendResult]] = {}

    def __len__(self) -> int:
        """Keys held whole in memory."""
        return len(self._keys)

    @property
    def loaded(self) -> bool:
        """Whether the first load of the window (on the first keyed append) has finished."""
        return self._loaded

    def known(self, key: str) -> AppendResult | None:
        """The first answer to ``key``, if it is in memory."""
        return self._keys.get(key)

    # ------------------------------------------------------------- appends waiting on a key

    def waiter(self, key: str) -> asyncio.Future[AppendResult] | None:
        """The answer of an append with ``key`` that is still in flight, to wait on."""
        return self._waiters.get(key)

    def wait_on(self, key: str, shared: asyncio.Future[AppendResult]) -> None:
        """An append with ``key`` was queued: later duplicates wait on ``shared``."""
        self._waiters[key] = shared

    def resolved(self, key: str, r: AppendResult, seq_no: int | None) -> None:
        """The append with ``key`` was answered ``r``, from fragment ``seq_no`` (None: answered
        from a key already known)."""
        if seq_no is not None:
            self._remember(key, r, seq_no)
        self._waiters.pop(key, None)

    def rejected(self, key: str, shared: asyncio.Future[AppendResult] | None) -> None:
        """The append with ``key`` whose duplicates wait on ``shared`` failed."""
        if self._waiters.get(key) is shared:
            del self._waiters[key]

    def fail_waiters(self, err: BaseException) -> None:
        """The writer stopped: nobody waits on a key any more."""
        for w in self._waiters.values():
            if not w.done():
                w.set_exception(err)
                w.exception()
        self._waiters.clear()

    # ------------------------------------------------------------------------ the window

    def _remember(self, key: str, r: AppendResult, seq_no: int) -> None:
        self._keys[key] = r
        self._keys.move_to_end(key)
        self._key_seq[key] = seq_no
        while len(self._keys) > self._opts.window_keys:
            old = self._keys.popitem(last=False)[0]
            seq = self._key_seq.pop(old, None)
            if seq is not None and self._opts.spill_keys > 0:
                # Still within the fragment window: keep a pointer to its footer.
                self._spill[hash(old)] = seq
                while len(self._spill) > self._opts.spill_keys:
                    del self._spill[next(iter(self._spill))]

    async def spilled(self, key: str) -> AppendResult | None:
        """A key pushed out of memory but still within the fragment window: from its footer."""
        seq = self._spill.get(hash(key))
        if seq is None or seq < self._next_seq_no() - self._opts.window_fragments:
            return None
        try:
            got = await self._store.get(join(self._prefix, fragment_path(seq)))
            keys, timestamp_us = await asyncio.to_thread(read_keys, got.data)
        except (ObjectNotFound, CorruptFragment):
            return None
        entry = keys.get(key)
        if entry is None:
            return None  # another key with the same hash
        self._stats["dedup_footer_hits"] += 1
        return AppendResult(entry[0], entry[1], timestamp_us, digest=key_digest(entry))

    def expire(self) -> None:
        """Forget keys whose fragment left the window: memory stays bounded by the window, which
        is also all a reopened writer would know (keys are kept in insertion order, ~seq order)."""
        horizon = self._next_seq_no() - self._opts.window_fragments
        while self._keys:
            key = next(iter(self._keys))
            if self._key_seq.get(key, horizon) >= horizon:
                break
            del self._keys[key]
            self._key_seq.pop(key, None)
        while self._spill:
            h = next(iter(self._spill))
            if self._spill[h] >= horizon:
                break
            del self._spill[h]

    def unlearned(self, seqs: Iterable[int]) -> None:
        """Fragments whose keys must be learned before the window is complete (others linked
        them: read repair, another writer)."""
        self._unlearned.update(seqs)

    async def ensure_loaded(self) -> None:
        """Learn every key of the window not learned yet (the first keyed append after open
        reads the whole window)."""
        if self._loaded and not self._unlearned:
            return
        async with self._lock:
            if not self._loaded:
                # The window is the last ``window_fragments`` sequence numbers, read by path:
                # wherever they sit (root or snapshots) and even when garbage collection already
                # unlinked them (it keeps their objects for the window).  Every sequence number
                # below the tail was linked once, so every such object is the log's own.
                nxt = self._next_seq_no()
                self._unlearned.update(range(max(1, nxt - self._opts.window_fragments), nxt))
            while self._unlearned:
                await self.learn()
            self._loaded = True

    async def learn(self) -> None:
        """Read the footers of the unlearned fragments into the idempotency window (the log is
        the source of truth), and settle queued appends whose key is already in the log."""
        seqs = sorted(self._unlearned)
        sem = asyncio.Semaphore(16)

        async def footer(seq: int) -> tuple[dict[str, KeyEntry], int]:
            async with sem:
                try:
                    got = await self._store.get(join(self._prefix, fragment_path(seq)))
                except ObjectNotFound:
                    return {}, 0  # collected long ago: outside the window
            return read_keys(got.data)

        found = await asyncio.gather(*(footer(seq) for seq in seqs))
        for seq, (keys, timestamp_us) in zip(seqs, found, strict=True):
            for k, entry in keys.items():
                if k not in self._keys:
                    # The answer the append got: its offsets and its fragment's timestamp.
                    r = AppendResult(entry[0], entry[1], timestamp_us, digest=key_digest(entry))
                    self._remember(k, r, seq)
        self._unlearned.difference_update(seqs)
        self._on_learned()
