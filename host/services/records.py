"""Records: appends (idempotent, with compaction backpressure), reads (long-polls, streamed
answers), a log's state and its fragment URLs."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from uuid import UUID

from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive

from wal3 import (
    AppendResult,
    Backpressure,
    FragmentPointer,
    Limits,
    LogContention,
    LogPurged,
    LogWriter,
    ObjectStore,
)
from wal3.fragment import request_digest
from wal3.paths import join

from ..appendbody import AppendBody, AppendDecoder, RecordLimits, record_count
from ..auth import Role
from ..config import Settings
from ..errors import BackpressureError, Conflict
from ..manager import LogHandle, LogManager
from ..metrics import Metrics
from ..models import AppendResponse, FragmentOut, FragmentsResponse, LogState
from ..pages import empty_answer, records_answer
from ..requests import disconnected
from .logview import log_state, stored_compaction_offset

# The 429's reason (README) when a log's uncompacted backlog is over the limit (not a cursor name).
_BACKLOG = "compaction"
# Appends retried here after a contention while this host still writes the log (membership).
_CONTENTION_RETRIES = 2
# Rounds of claiming a log and waiting its take-over fence out of its open-log slot (another host
# may take it back meanwhile); after them the append waits inside the writer.
_FENCE_ROUNDS = 3


def _mismatch() -> Conflict:
    return Conflict("idempotency_key: already used for a different request", "idempotency_mismatch")


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """``GET .../records``: from where, how many, how long to wait for some."""

    from_offset: int
    limit: int
    wait_ms: int


class RecordService:
    """The records of collection logs, through the log manager."""

    def __init__(
        self, store: ObjectStore, manager: LogManager, metrics: Metrics, settings: Settings
    ) -> None:
        self._store = store
        self._manager = manager
        self._metrics = metrics
        self._max_request_bytes = settings.max_request_bytes
        self._backlog_limit = settings.backpressure_uncompacted_records
        self.decoder = AppendDecoder(RecordLimits.from_settings(settings))

    def close(self) -> None:
        """Let the append decoder's threads go."""
        self.decoder.close()

    # ------------------------------------------------------------------------------- appends

    async def append(self, tenant: str, cid: UUID, raw: bytes, started: float) -> AppendResponse:
        """Append a request body's records; answered once durable (``started``: when the
        request began, for the latency metric)."""
        # A request its tenant's rate quotas refuse is refused before its body is decoded: a
        # refused flood must not cost the loop its decoding (its records are only counted).
        # Only a tenant with a rate quota pays for the count.
        quota = self._manager.quotas.quota(tenant)
        if quota.appends_per_s is not None or quota.records_per_s is not None:
            count = record_count(raw)
            if count:
                self._manager.precheck(tenant, cid, quota, records=count)
        req, bodies = await self.decoder.decode(raw)
        nbytes = sum(len(b) for b in bodies)
        # The request's one admission (tenant quotas): nothing later fails it by a quota; its
        # bytes are held until they are durable or the request failed.
        admission = await self._manager.admit(
            tenant, cid, records=len(bodies), nbytes=nbytes, create=True, quota=quota
        )
        try:
            result, writer = await self._append_admitted(tenant, cid, req, bodies, nbytes)
        finally:
            admission.release()
        await writer.wait_fence()  # no read anywhere may miss what this answer acknowledges
        if result.deduplicated:
            self._metrics.idempotent_hits.inc()
        else:
            self._metrics.append_records.inc(result.count)
            self._metrics.append_bytes.inc(nbytes)
        self._metrics.append_latency.observe(time.monotonic() - started)
        return AppendResponse(
            first_offset=result.first_offset,
            count=result.count,
            next_offset=result.next_offset,
            deduplicated=True if result.deduplicated else None,
        )

    async def _append_admitted(
        self, tenant: str, cid: UUID, req: AppendBody, bodies: list[bytes], nbytes: int
    ) -> tuple[AppendResult, LogWriter]:
        """The append of an admitted request: durable when it returns."""
        self._manager.reserve(nbytes)
        try:
            for attempt in range(_FENCE_ROUNDS + 1):
                async with self._manager.use(cid, tenant, create=True) as h:
                    await self._check_compaction_backlog(h)
                    writer = h.writer
                    # A take-over links no record before its fence has passed (wal3's lease,
                    # "Claim"): claim the log now and wait the fence out below, outside use(),
                    # as the answer's own fence is: a waiting append must not pin an open-log
                    # slot.  (Past the last round the writer waits inside, which is as safe.)
                    await writer.claim()
                    if not writer.fencing or attempt == _FENCE_ROUNDS:
                        result = await self._append_counted(h, bodies, req.idempotency_key)
                        if result.deduplicated:
                            await self._check_same_request(h, result, bodies)
                        break
                await writer.wait_fence()
        finally:
            self._manager.release(nbytes)
        return result, writer

    async def _append_counted(
        self, h: LogHandle, bodies: list[bytes], key: str | None
    ) -> AppendResult:
        """``_append_routed``, counting why it failed (the request itself is counted by its
        answer, host.middleware)."""
        try:
            # The take-over fence is waited for by the caller, outside use(): a waiting answer
            # must not pin an open-log slot.
            return await self._append_routed(h, bodies, key)
        except LogContention:
            self._metrics.contention.inc()
            raise
        except Backpressure:
            self._metrics.backpressure.labels("batching").inc()
            raise

    async def _append_routed(
        self, h: LogHandle, bodies: list[bytes], key: str | None
    ) -> AppendResult:
        """``append_many`` (the take-over fence waited for by the caller).  A contention (another
        host appended: two hosts' views of the membership differ for a refresh) is routed again:
        a 307 to the host that writes the log now, or a retry here when it is still this one."""
        for attempt in range(_CONTENTION_RETRIES + 1):
            try:
                return await h.writer.append_many(bodies, idempotency_key=key, fence=False)
            except LogContention:
                if attempt == _CONTENTION_RETRIES or not await self._manager.contended(h):
                    raise
                self._metrics.contention.inc()  # this one is retried (the last one is answered)
        raise AssertionError("unreachable")

    async def _check_same_request(
        self, h: LogHandle, result: AppendResult, bodies: list[bytes]
    ) -> None:
        """A reused idempotency key must carry the same records: 409 otherwise.

        The key keeps a hash of the records it first appended (in the writer's window and the
        fragment footer, so across restarts and fail-overs, and after those records are
        collected).  A key written before keys carried a hash is checked against the log's own
        records while they are there, and by count once they are collected.
        """
        if result.count != len(bodies):
            raise _mismatch()
        if result.digest is not None:
            # The key's own hash of its request: it holds after the records are collected.
            if result.digest != request_digest(bodies):
                raise _mismatch()
            return
        try:
            stored = await h.reader.read(
                result.first_offset,
                Limits(max_records=result.count, max_bytes=2 * self._max_request_bytes),
                manifest=await self._manager.view(h),
            )
        except LogPurged:
            # A key from before keys carried a hash, collected since: only the count compares.
            return
        got = [r.body for r in stored if r.offset < result.first_offset + result.count]
        if got != bodies:
            raise _mismatch()

    async def _check_compaction_backlog(self, h: LogHandle) -> None:
        limit = self._backlog_limit
        if h.writer.manifest.next_offset - h.compaction_offset <= limit:
            return
        # Maybe a compactor advanced the cursor through another path: look before refusing.
        await stored_compaction_offset(h)
        backlog = h.writer.manifest.next_offset - h.compaction_offset
        if backlog > limit:
            self._metrics.backpressure.labels(_BACKLOG).inc()
            raise BackpressureError(f"{backlog} uncompacted records (limit {limit})", _BACKLOG, 5)

    # --------------------------------------------------------------------------------- reads

    async def read(
        self, tenant: str, cid: UUID, req: ReadRequest, *, role: Role, receive: Receive
    ) -> Response:
        """Records from an offset, waiting up to ``wait_ms`` for some (outside the open-log
        slot); ``receive`` tells when the client hangs up, ``role`` whose long-poll share the
        wait counts against."""
        started = time.monotonic()
        deadline = started + req.wait_ms / 1000.0
        from_ = req.from_offset
        gone: asyncio.Task[None] | None = None
        limits = Limits(max_records=req.limit, max_bytes=self._max_request_bytes)
        pointers: list[FragmentPointer] = []
        try:
            while True:
                async with self._manager.use(cid, tenant) as h:
                    m = await self._manager.view(h)
                    if from_ < m.oldest_offset:
                        raise LogPurged(from_, m.oldest_offset)
                    if from_ < m.next_offset:
                        pointers = await h.reader.scan(from_, limits, manifest=m)
                        break
                if time.monotonic() >= deadline or self._manager.draining:
                    break
                # Wait outside use(): a waiting request holds no open-log slot, and it stops
                # when its client hangs up, at shutdown, or when the log moves.
                if gone is None:
                    gone = asyncio.create_task(disconnected(receive))
                why = await self._manager.wait_for_records(
                    h, tenant, role.name.lower(), from_, deadline, gone
                )
                if why == "disconnected":
                    raise ClientDisconnect()
                if why in ("timeout", "drain"):
                    break
                if why == "changed" and not h.lost:
                    break  # evicted or closed meanwhile: answer empty; the client polls again
        finally:
            if gone is not None:
                gone.cancel()
        # Fragments are immutable: they are fetched (and a large answer streamed) outside use().
        answer = (
            await records_answer(h.reader, pointers, from_, req.limit, self._max_request_bytes)
            if pointers
            else empty_answer(from_)
        )
        self._metrics.read_latency.observe(time.monotonic() - started)
        return answer

    # ------------------------------------------------------------------------ state & co

    async def state(self, tenant: str, cid: UUID) -> LogState:
        """The log's state."""
        async with self._manager.use(cid, tenant) as h:
            return await log_state(self._manager, h)

    async def fragments(
        self, tenant: str, cid: UUID, from_: int | None, limit: int
    ) -> FragmentsResponse:
        """Fragment URLs from ``from_`` (default: the compaction cursor, or the oldest offset
        when the log was collected past it)."""
        async with self._manager.use(cid, tenant) as h:
            m = await self._manager.view(h)
            start = from_ if from_ is not None else await stored_compaction_offset(h)
            start = max(start, m.oldest_offset) if from_ is None else start
            ptrs = await h.reader.scan(start, Limits(max_files=limit), manifest=m)
        return FragmentsResponse(fragments=[self._fragment(h, p) for p in ptrs])

    def _fragment(self, h: LogHandle, p: FragmentPointer) -> FragmentOut:
        return FragmentOut(
            url=self._store.url_for(join(h.prefix, p.path)),
            start=p.start,
            limit=p.limit,
            num_bytes=p.num_bytes,
            setsum=p.setsum.hexdigest(),
            content_md5=p.content_md5,
        )
