"""What requests read of an open log besides its records: the compaction cursor as stored, and
the log's state."""

from __future__ import annotations

from wal3.cursors import COMPACTION

from ..manager import LogHandle, LogManager
from ..models import LogState


async def stored_compaction_offset(h: LogHandle) -> int:
    """The compaction cursor as stored: another host (or the compactor through another path)
    may have advanced it, and no lease covers the handle's memory of it.  The cursor only moves
    forward, so the memory is a floor."""
    w = await h.cursors.load(COMPACTION)
    if w is not None:
        h.note_compaction(w.cursor.offset)
    return h.compaction_offset


async def log_state(manager: LogManager, h: LogHandle) -> LogState:
    """``GET .../logs/{uuid}``: offsets, compaction offset, setsum, sealed, fragments, bytes."""
    m = await manager.view(h)
    compaction = await stored_compaction_offset(h)
    first_seq = m.initial_seq_no if m.initial_seq_no is not None else 1
    return LogState(
        collection_id=str(h.collection_id),
        tenant=h.tenant,
        oldest_offset=m.oldest_offset,
        next_offset=m.next_offset,
        compaction_offset=compaction,
        setsum=m.setsum.hexdigest(),
        sealed=m.sealed,
        fragments=max(0, m.next_seq_no - first_seq),
        bytes=m.live_bytes,
    )
