"""The answer of ``GET …/records``: assembled from stored bodies, streamed when it is large.

An answer may reach ``max_request_bytes`` (8 MiB).  Built whole, it sits in memory until the
client has taken it, and a client that never reads would pin it for as long as the connection
lives.  So a large answer is streamed a group of fragments at a time (about 1 MiB of decoded
records: groups and the decision to stream go by decoded bytes, never by the stored, compressed
size, so compressible records cannot make one group hold the whole page),
and the next group is fetched only once the socket has taken the previous one (an empty chunk
waits for the transport to drain): a slow reader holds one group, not the whole answer, and the
send timeout of ``host.httpserver`` ends it.  A small answer, the usual one, is one body with a
``Content-Length``, as before.

The bytes are those of a whole answer either way: ``{"records":[…],"next_offset":N}``.  What a
page holds follows ``LogReader.read`` exactly: records from ``from_offset``, at most ``limit``,
and at most ``max_bytes`` of bodies unless the first record alone is larger.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from starlette.responses import Response, StreamingResponse

from wal3 import LogReader
from wal3.errors import Wal3Error
from wal3.fragment import DecodedFragment
from wal3.manifest import FragmentPointer

_log = logging.getLogger("loghost.api")

# Fragments fetched (and held) at once for one answer, by their size in the store.
GROUP_BYTES = 1 << 20
_FETCH_CONCURRENCY = 8


def fragment_groups(
    pointers: Sequence[FragmentPointer], group_bytes: int = GROUP_BYTES
) -> list[list[FragmentPointer]]:
    """Consecutive runs of pointers of at most ``group_bytes`` each (at least one pointer)."""
    groups: list[list[FragmentPointer]] = []
    cur: list[FragmentPointer] = []
    size = 0
    for p in pointers:
        if cur and size + p.num_bytes > group_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += p.num_bytes
    if cur:
        groups.append(cur)
    return groups


class RecordPage:
    """The records one answer takes, fragment after fragment, as JSON."""

    def __init__(self, from_offset: int, limit: int, max_bytes: int) -> None:
        self.next_offset = from_offset
        self.count = 0
        self.nbytes = 0
        self.full = False
        self._limit = limit
        self._max_bytes = max_bytes

    def take(self, frags: Sequence[DecodedFragment]) -> bytes:
        """The JSON of the records these fragments add (comma-led after the first record)."""
        parts: list[bytes] = []
        for frag in frags:
            for r in frag.records:
                if r.offset < self.next_offset:
                    continue
                if self.count >= self._limit or (
                    self.count and self.nbytes + len(r.body) > self._max_bytes
                ):
                    self.full = True
                    break
                parts.append(
                    b'{"offset":%d,"timestamp_us":%d,"record":%s}'
                    % (r.offset, r.timestamp_us, r.body)
                )
                self.count += 1
                self.nbytes += len(r.body)
                self.next_offset = r.offset + 1
            if self.full:
                break
        if not parts:
            return b""
        lead = b"," if self.count > len(parts) else b""
        return lead + b",".join(parts)

    def tail(self) -> bytes:
        """What closes the answer."""
        return b'],"next_offset":%d}' % self.next_offset


HEAD = b'{"records":['


async def fetch_group(reader: LogReader, group: Sequence[FragmentPointer]) -> list[DecodedFragment]:
    """Fetch and verify a group of fragments, a few at a time, in order."""
    sem = asyncio.Semaphore(_FETCH_CONCURRENCY)

    async def one(p: FragmentPointer) -> DecodedFragment:
        async with sem:
            return await reader.fetch(p)

    return list(await asyncio.gather(*(one(p) for p in group)))


def empty_answer(from_offset: int) -> Response:
    """An answer with no records."""
    return Response(HEAD + RecordPage(from_offset, 1, 1).tail(), media_type="application/json")


def _decoded_bytes(frags: Sequence[DecodedFragment]) -> int:
    return sum(len(r.body) for f in frags for r in f.records)


async def _groups(
    reader: LogReader, pointers: Sequence[FragmentPointer]
) -> AsyncGenerator[list[DecodedFragment], None]:
    """The fragments, fetched a group at a time; a group is about ``GROUP_BYTES`` *decoded*.

    Only stored sizes are known before a fetch, so the first group is one fragment, and each
    later group takes as many stored bytes as the largest decoded/stored ratio seen so far says
    make ``GROUP_BYTES`` decoded (compressible records: few fragments at a time)."""
    ratio = 1.0
    i = 0
    while i < len(pointers):
        budget = GROUP_BYTES / ratio if i else 0
        group = [pointers[i]]
        size = pointers[i].num_bytes
        i += 1
        while i < len(pointers) and size + pointers[i].num_bytes <= budget:
            group.append(pointers[i])
            size += pointers[i].num_bytes
            i += 1
        frags = await fetch_group(reader, group)
        ratio = max(ratio, _decoded_bytes(frags) / max(1, size))
        yield frags


async def records_answer(
    reader: LogReader,
    pointers: Sequence[FragmentPointer],
    from_offset: int,
    limit: int,
    max_bytes: int,
) -> Response:
    """The answer for ``pointers`` (from ``LogReader.scan``), whole or streamed.

    Groups, and whether to stream, go by decoded bytes (what the answer holds), never by the
    stored (compressed) size.  The first group is fetched before anything is sent, so its
    failures (a corrupt or missing fragment, a store outage) are the request's error status.  A
    later group that fails ends the answer early, well-formed, with ``next_offset`` where it
    stopped: the client reads on from there and meets the error itself.
    """
    page = RecordPage(from_offset, limit, max_bytes)
    if not pointers:
        return empty_answer(from_offset)
    groups = _groups(reader, pointers)
    first = page.take(await anext(groups))
    done = False
    # Small so far: take more groups while the body stays within about one group (one body if
    # the answer ends there: the usual small answer keeps its Content-Length).
    while not page.full and len(first) <= GROUP_BYTES:
        try:
            frags = await anext(groups)
        except StopAsyncIteration:
            done = True
            break
        first += page.take(frags)
        del frags
    if done or page.full:
        await groups.aclose()
        return Response(HEAD + first + page.tail(), media_type="application/json")

    async def stream() -> AsyncIterator[bytes]:
        try:
            yield HEAD + first
            while not page.full:
                # Sending nothing waits until the socket took what was sent before: hold one
                # group.
                yield b""
                try:
                    frags = await anext(groups)
                except StopAsyncIteration:
                    break
                except (Wal3Error, OSError) as e:
                    _log.warning("records answer cut short at offset %d: %r", page.next_offset, e)
                    break
                chunk = page.take(frags)
                del frags
                yield chunk
            yield page.tail()
        finally:
            await groups.aclose()

    return StreamingResponse(stream(), media_type="application/json")
