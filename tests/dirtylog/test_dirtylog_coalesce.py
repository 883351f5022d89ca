"""Property tests of the pure coalescing function."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from dirtylog import Coalesced, DirtyRecord, RecordKind, coalesce

from .helpers import cid

IDS = [cid(i) for i in range(4)]

marks = st.builds(
    lambda c, pos, n, t, r: DirtyRecord(c, pos, n, t, r, RecordKind.MARK_DIRTY),
    st.sampled_from(IDS),
    st.integers(1, 50),
    st.integers(0, 20),
    st.integers(0, 1000),
    st.integers(0, 5),
)
purges = st.builds(lambda c, t: DirtyRecord.purge(c, t), st.sampled_from(IDS), st.integers(0, 1000))
clears = st.builds(DirtyRecord.clear, st.integers(0, 1000))
logs = st.lists(st.one_of(marks, marks, marks, purges, clears), max_size=40)
cursors = st.one_of(st.none(), st.dictionaries(st.sampled_from(IDS), st.integers(1, 70)))


def model(
    records: list[DirtyRecord], compacted: dict[uuid.UUID, int] | None
) -> dict[uuid.UUID, Coalesced]:
    """The rules written the other way round: look back from the end to each collection's last purge."""
    out: dict[uuid.UUID, Coalesced] = {}
    for c in IDS:
        purges_of_c = [
            i for i, r in enumerate(records) if r.kind == RecordKind.PURGE and r.collection_id == c
        ]
        last_purge = max(purges_of_c, default=-1)
        live = []
        for r in records[last_purge + 1 :]:
            if r.kind != RecordKind.MARK_DIRTY or r.collection_id != c:
                continue
            start, reinserts = r.log_position, r.reinsert_count
            if compacted is not None:
                cur = compacted.get(c, 1)
                if cur > start:
                    start, reinserts = cur, 0
            if start < r.end:
                live.append((start, r.end, r.initial_insertion_epoch_us, reinserts))
        if live:
            out[c] = Coalesced(
                min(x[0] for x in live),
                max(x[1] for x in live),
                min(x[2] for x in live),
                max(x[3] for x in live),
            )
    return out


@settings(max_examples=300)
@given(logs, cursors)
def test_coalesce_matches_the_model(
    records: list[DirtyRecord], compacted: dict[uuid.UUID, int] | None
) -> None:
    assert coalesce(records, compacted) == model(records, compacted)


@given(logs, cursors)
def test_duplicating_the_window_changes_nothing(
    records: list[DirtyRecord], compacted: dict[uuid.UUID, int] | None
) -> None:
    """A crashed roll-up re-reads its window: reading records twice must be harmless."""
    assert coalesce(records + records, compacted) == coalesce(records, compacted)


@given(logs, cursors, st.integers(0, 1000))
def test_carrying_the_result_forward_preserves_it(
    records: list[DirtyRecord], compacted: dict[uuid.UUID, int] | None, now: int
) -> None:
    """Re-appended carries, read alone or together with their sources, give the same spans."""
    first = coalesce(records, compacted)
    carried = [
        DirtyRecord(
            c,
            s.start,
            s.num_records,
            s.first_insertion_us,
            s.reinsert_count + 1,
            RecordKind.MARK_DIRTY,
        )
        for c, s in first.items()
    ]
    for window in (carried, records + carried, [*records, DirtyRecord.clear(now), *carried]):
        again = coalesce(window, compacted)
        assert {c: (s.start, s.limit, s.first_insertion_us) for c, s in again.items()} == {
            c: (s.start, s.limit, s.first_insertion_us) for c, s in first.items()
        }
        assert all(again[c].reinsert_count == first[c].reinsert_count + 1 for c in first)


@given(logs, st.sampled_from(IDS), st.integers(1, 50), st.integers(1, 20))
def test_a_mark_after_a_purge_is_never_dropped(
    records: list[DirtyRecord], c: uuid.UUID, pos: int, n: int
) -> None:
    window = [*records, DirtyRecord.purge(c, 0), DirtyRecord.mark(c, pos, n, 5)]
    got = coalesce(window)
    assert got[c] == Coalesced(pos, pos + n, 5, 0)


@given(logs)
def test_clear_is_a_no_op(records: list[DirtyRecord]) -> None:
    assert coalesce([DirtyRecord.clear(1), *records, DirtyRecord.clear(2)]) == coalesce(
        [r for r in records if r.kind != RecordKind.CLEAR]
    )
