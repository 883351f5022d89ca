"""Adversarial review of the read leases and idempotency windows (issue 21): engine-only
reproductions that still break them.  Each is ``xfail(strict=True)`` until fixed.

1. **A lease renewal racing the writer's own manifest write fences the writer against
   itself.**  ``confirm_lease`` remembers the etag it vouches for, issues a HEAD, and when the
   HEAD shows another etag it drops authorship (``_authored = None``).  If that other etag is
   the writer's *own* next manifest, whose answer has not reached the writer yet, the write's
   ``_landed`` then finds no authored base and takes it for a take-over: the writer holds every
   acknowledgement for ``1.25 x`` the lease although no other writer exists.  A log read while
   idle (a long-poll renews every lease) and then appended to pays that stall at random.
2. **The idempotency window is 10,000 keys, not 256 fragments.**  The README promises a retry
   "within the last 256 fragments of the log" is deduplicated; the writer drops keys beyond
   ``dedup_window_keys`` (10,000) even inside those fragments, and a retry of a dropped key is
   appended again: a duplicate of an acknowledged append.  Group commit packs many keyed
   appends per fragment, so a busy log passes 10,000 keys in far fewer than 256 fragments.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from wal3 import BatchOptions, LeaseOptions, LocalStore, LogWriter, LogWriterOptions, ObjectStore
from wal3.store import GetResult, ObjectMeta

from .test_read_lease import ManualClock, _settle


class GatedStore(ObjectStore):
    """A real store whose next manifest put, once armed, lands and then keeps its answer until
    the test opens the gate (a slow response, deterministically)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.armed = False
        self.landed = asyncio.Event()
        self.gate = asyncio.Event()

    async def get(self, key: str) -> GetResult:
        return await self.inner.get(key)

    async def head(self, key: str) -> ObjectMeta:
        return await self.inner.head(key)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        etag = await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
        if self.armed and key.endswith("manifest/MANIFEST"):
            self.armed = False
            self.landed.set()
            await self.gate.wait()
        return etag

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectMeta]:
        return self.inner.list(prefix, start_after=start_after)

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)


async def test_a_lease_renewal_racing_our_own_write_does_not_fence_us(tmp_path: Path) -> None:
    clock = ManualClock()
    store = GatedStore(LocalStore(tmp_path / "store"))
    w = await LogWriter.open(
        store,
        "logs/g",
        LogWriterOptions(
            writer_name="only",
            clock=clock,
            batch=BatchOptions(interval_s=0),
            lease=LeaseOptions(read_lease_s=1.0),
        ),
    )
    await w.append(b"r1")
    clock.advance(1.0)  # idle for a lease: the next read renews it with a HEAD
    assert w.current_manifest() is None
    store.armed = True
    append = asyncio.create_task(w.append(b"r2"))
    await store.landed.wait()  # our manifest with r2 is stored; its answer is not back yet
    renewed = await w.confirm_lease()  # a reader renews: the HEAD sees our own new manifest
    store.gate.set()
    await _settle()
    # Nobody but this writer ever wrote the log: nothing may wait for a take-over fence.
    assert append.done(), f"r2 held by a fence until {w.fence_until} (now {clock.monotonic()})"
    assert (await append).offset == 2
    assert renewed or w.current_manifest() is not None
    await w.close()


async def test_a_retry_within_the_last_256_fragments_is_deduplicated(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    opts = LogWriterOptions(writer_name="w")  # the defaults the log host uses
    w = await LogWriter.open(store, "logs/k", opts)
    n = opts.idempotency.window_keys + 1
    # Many clients, one keyed append each, at once: group commit packs them into few fragments.
    results: list[Any] = await asyncio.gather(
        *(w.append_many([b'{"id":"%d"}' % i], idempotency_key=f"k{i}") for i in range(n))
    )
    first = results[0]
    fragments_since = w.manifest.next_seq_no - 1  # every fragment of the log, k0's included
    assert fragments_since < opts.idempotency.window_fragments, fragments_since
    retry = await w.append_many([b'{"id":"0"}'], idempotency_key="k0")
    assert retry.deduplicated, (
        f"k0 appended again at {retry.first_offset} (first at "
        f"{first.first_offset}), {fragments_since} fragments later"
    )
    await w.close()
