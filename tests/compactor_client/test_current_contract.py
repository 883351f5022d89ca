"""``compacted/{id}/CURRENT.json``: its bytes and its validation (other programs read it).

The format is a contract: compactors of this and older releases, and readers of the compacted
layout, parse it.  These pin the encoding byte for byte (format 2, the leveled layout), how a
pointer of the single-version layout (format 1) still reads (one bottom-level run), what is
refused as corrupt (with the key named), and what the history keeps.
"""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import pyarrow.parquet as pq
import pytest

from compactor_client.fold import Row
from compactor_client.versions import (
    HISTORY_LIMIT,
    CorruptCurrent,
    CurrentVersion,
    RunEntry,
    _decode,
    _encode,
    encode_rows,
)

CID = "00000000-0000-4000-8000-000000000001"
KEY = f"compacted/{CID}/CURRENT.json"
RUN = f"compacted/{CID}/v0000000000000003/run-t-0.parquet"
P = (RunEntry(key=RUN, rows=2, bytes=90, tombstones=1, sketch="AQID"),)


def _doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 3,
        "offset": 11,
        "rows": 2,
        "path": f"compacted/{CID}/v0000000000000003/part-t.parquet",
    }
    doc.update(over)
    return doc


def test_the_pointer_is_compact_key_sorted_json() -> None:
    old = f"compacted/{CID}/v0000000000000001/run-u-0.parquet"
    cur = CurrentVersion(
        version=3,
        offset=11,
        rows=3,
        runs=(
            RunEntry(key=RUN, rows=2, bytes=90, tombstones=1, sketch="AQID"),
            RunEntry(key=f"compacted/{CID}/v0000000000000001/part-t.parquet", rows=1),
        ),
        etag="e",
        installed_at=30.5,
        history=((2, 20.0), (1, 10.0)),
        stored=((2, 21.0),),
        retired=((old, 2),),
    )
    assert _encode(cur.document()) == (
        b'{"format":2,"history":[{"installed_at":20.0,"stored_at":21.0,"version":2},'
        b'{"installed_at":10.0,"version":1}],"installed_at":30.5,"offset":11,'
        b'"retired":[{"key":"' + old.encode() + b'","until":2}],"rows":3,'
        b'"runs":[{"bytes":90,"key":"' + RUN.encode() + b'","level":0,"rows":2,'
        b'"sketch":"AQID","tombstones":1},{"key":"compacted/' + CID.encode() + b"/"
        b'v0000000000000001/part-t.parquet","level":1,"rows":1,"tombstones":0}],"version":3}'
    )


def test_a_pointer_reads_back_as_written() -> None:
    cur = CurrentVersion(
        version=3,
        offset=11,
        rows=2,
        runs=P,
        etag="e",
        installed_at=30.5,
        history=((2, 20.0), (1, 10.0)),
        stored=((2, 21.0), (1, 11.0)),
        retired=((f"compacted/{CID}/v0000000000000002/run-x-0.parquet", 2),),
    )
    back = _decode(CID, _encode(cur.document()), "e")
    assert back == cur
    assert back.installs() == {3: 30.5, 2: 20.0, 1: 10.0}
    assert back.store_installs() == {2: 21.0, 1: 11.0}


def test_history_keeps_the_newest_installs_newest_first() -> None:
    history = tuple((v, float(v)) for v in range(1, HISTORY_LIMIT + 10))
    doc = CurrentVersion(
        version=HISTORY_LIMIT + 10,
        offset=2,
        rows=0,
        runs=(),
        etag="e",
        installed_at=1.0,
        history=history,
    ).document()
    versions = [h["version"] for h in doc["history"]]
    assert versions == list(range(HISTORY_LIMIT + 9, 9, -1))


def test_a_version_known_only_by_its_store_time_keeps_an_entry() -> None:
    doc = CurrentVersion(
        version=2, offset=2, rows=0, runs=(), etag="e", installed_at=5.0, stored=((1, 4.0),)
    ).document()
    assert doc["history"] == [{"version": 1, "installed_at": 4.0, "stored_at": 4.0}]


def test_a_pointer_of_the_single_version_layout_reads_as_one_bottom_run() -> None:
    """Migration: format 1 (no "format", a "path") is one run at the bottom level, of its rows;
    the next install writes format 2 listing that run (or retiring it after a merge)."""
    cur = _decode(CID, json.dumps(_doc(installed_at=1.0)).encode(), "e")
    assert cur.format == 1 and cur.levels == 1
    assert cur.runs == (RunEntry(key=_doc()["path"], rows=2, bytes=None),)
    assert cur.path == _doc()["path"] and cur.retired == ()
    again = _decode(CID, _encode(cur.document()), "e")
    assert again.format == 2 and again.runs == cur.runs


def test_an_old_pointer_without_times_is_read() -> None:
    cur = _decode(CID, json.dumps(_doc()).encode(), "e")
    assert (cur.version, cur.offset, cur.rows, cur.installed_at, cur.history, cur.stored) == (
        3,
        11,
        2,
        None,
        (),
        (),
    )
    assert _decode(CID, json.dumps(_doc(offset=1, rows=0, version=1)).encode(), "e").rows == 0


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        (b"{", "Expecting"),
        (json.dumps({"version": 1}).encode(), "KeyError"),
        (json.dumps(_doc(version=0)).encode(), "invalid pointer"),
        (json.dumps(_doc(offset=0)).encode(), "invalid pointer"),
        (json.dumps(_doc(rows=-1)).encode(), "invalid pointer"),
        (json.dumps(_doc(rows=True)).encode(), "invalid pointer"),
        (json.dumps(_doc(version=1.0)).encode(), "invalid pointer"),
        (json.dumps(_doc(path=5)).encode(), "invalid runs"),
        (json.dumps({**_doc(), "format": 2}).encode(), "invalid runs"),  # no runs
        (json.dumps({**_doc(), "format": 3, "runs": []}).encode(), "unknown format"),
        (
            json.dumps({**_doc(), "format": 2, "runs": [{"key": RUN, "rows": "x"}]}).encode(),
            "invalid runs",
        ),
        (
            # Another collection's run (a copied pointer not rewritten): its owner prunes it.
            json.dumps(
                {
                    **_doc(),
                    "format": 2,
                    "runs": [{"key": "compacted/x/v1/run-a.parquet", "rows": 1}],
                }
            ).encode(),
            "is not under",
        ),
        (json.dumps(_doc(installed_at="soon")).encode(), "invalid history"),
        (json.dumps(_doc(installed_at=1.0, history=[{"version": 1}])).encode(), "invalid history"),
        (
            json.dumps(
                _doc(
                    installed_at=1.0,
                    history=[{"version": 1, "installed_at": 1.0, "stored_at": "x"}],
                )
            ).encode(),
            "invalid history",
        ),
    ],
)
def test_a_corrupt_pointer_is_refused_naming_its_key(bad: bytes, what: str) -> None:
    with pytest.raises(CorruptCurrent, match=rf"^{KEY}: .*{what}"):
        _decode(CID, bad, "e")


def test_history_entries_carry_their_store_times() -> None:
    doc = _doc(
        installed_at=9.0,
        history=[
            {"version": 2, "installed_at": 8.0, "stored_at": 8.5},
            {"version": 1, "installed_at": 7.0},
        ],
    )
    cur = _decode(CID, json.dumps(doc).encode(), "e")
    assert cur.installed_at == 9.0
    assert cur.history == ((2, 8.0), (1, 7.0))
    assert cur.stored == ((2, 8.5),)


def test_versions_are_snappy_parquet() -> None:
    data = encode_rows([Row(id="a", document="d", metadata={"k": 1}, embedding=[1.0])])
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {"SNAPPY"}


# ------------------------------------------------------------------------- installs, end to end


async def test_an_install_answers_the_pointer_it_stored(tmp_path: Any) -> None:
    """What ``install_version`` returns is what the next reader of CURRENT.json gets (the
    compactor advances the cursor and prunes from it), the history newest first."""
    from compactor_client.versions import (
        allocate_version,
        install_version,
        read_current,
        write_rows,
    )
    from wal3.localstore import LocalStore

    store = LocalStore(tmp_path / "store")
    base = None
    for i, now in enumerate((100.0, 200.0, 300.0)):
        pending = allocate_version(CID, base, token=f"t{i}")
        await write_rows(store, pending, [Row(id=str(i))])
        out = await install_version(store, pending, offset=10 * (i + 1), rows=i + 1, now=now)
        assert out.installed is True and out.current is not None
        read = await read_current(store, CID)
        assert read is not None
        assert dataclasses.replace(read, stored_at=None) == out.current
        base = read
    got = await store.get(KEY)
    doc = json.loads(got.data)
    assert [h["version"] for h in doc["history"]] == [3, 2, 1]  # newest first, itself too
    assert doc["installed_at"] == 300.0 and doc["offset"] == 30 and doc["rows"] == 3


async def test_an_install_may_fold_nothing_but_never_go_back(tmp_path: Any) -> None:
    from compactor_client.versions import (
        allocate_version,
        install_version,
        read_current,
        write_rows,
    )
    from wal3.localstore import LocalStore

    store = LocalStore(tmp_path / "store")
    first = allocate_version(CID, None, token="a")
    await write_rows(store, first, [])
    assert (await install_version(store, first, offset=5, rows=0, now=1.0)).installed
    base = await read_current(store, CID)
    again = allocate_version(CID, base, token="b")
    await write_rows(store, again, [])
    with pytest.raises(ValueError, match=r"^offset 4 is behind the base version's 5$"):
        await install_version(store, again, offset=4, rows=0, now=2.0)
    assert (await install_version(store, again, offset=5, rows=0, now=2.0)).installed


async def test_a_version_file_is_never_overwritten(tmp_path: Any) -> None:
    from compactor_client.versions import allocate_version, write_rows
    from wal3.errors import PreconditionFailed
    from wal3.localstore import LocalStore

    store = LocalStore(tmp_path / "store")
    pending = allocate_version(CID, None, token="same")
    await write_rows(store, pending, [Row(id="a")])
    with pytest.raises(PreconditionFailed):
        await write_rows(store, pending, [Row(id="b")])


def test_etags_compare_with_or_without_quotes() -> None:
    from compactor_client.versions import _same_etag

    assert _same_etag('"abc"', "abc") and _same_etag("abc", '"abc"')
    assert not _same_etag('"abc"', '"abd"')
