"""Executor-side I/O by URL: local files and S3 through pyarrow (moto over HTTP, no JVM)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactor_client.executor import FoldTask, FragmentTask, fold_collection, read_fragment_task
from compactor_client.fold import Row, fold
from compactor_client.parquet_io import (
    S3Options,
    read_fragment,
    read_version,
    resolve,
    rows_to_table,
    write_version,
)

RECORDS = [
    {"id": "a", "op": "add", "document": "A", "metadata": {"k": 1}, "embedding": [0.25, 0.5]},
    {"id": "b", "op": "upsert", "document": "B", "metadata": None, "embedding": None},
    {
        "id": "a",
        "op": "update",
        "document": None,
        "metadata": {"k": None, "j": "x"},
        "embedding": None,
    },
    {"id": "b", "op": "delete", "document": None, "metadata": None, "embedding": None},
    {
        "id": "c",
        "op": "add",
        "document": None,
        "metadata": {"f": 1.5, "t": True},
        "embedding": [1.0],
    },
]


def fragment(start: int, records: list[dict]) -> bytes:
    table = pa.table(
        {
            "offset": pa.array(range(start, start + len(records)), pa.uint64()),
            "timestamp_us": pa.array([7] * len(records), pa.uint64()),
            "body": pa.array([json.dumps(r).encode() for r in records], pa.binary()),
        }
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def test_s3_options_from_env() -> None:
    opts = S3Options.from_env({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-1"})
    assert opts == S3Options(endpoint_override="127.0.0.1:9000", scheme="http", region="eu-1")
    opts = S3Options.from_env(
        {
            "AWS_ENDPOINT_URL_S3": "https://s3.local",
            "AWS_ENDPOINT_URL": "x",
            "AWS_DEFAULT_REGION": "r",
        }
    )
    assert opts == S3Options(endpoint_override="s3.local", scheme="https", region="r")
    assert S3Options.from_env({}) == S3Options()


def test_resolve_local_forms(tmp_path: Path) -> None:
    p = tmp_path / "with space" / "f.parquet"
    assert resolve(p.as_uri())[1] == str(p)
    assert resolve(str(p))[1] == str(p)
    with pytest.raises(ValueError):
        resolve("gs://bucket/x")


def test_version_roundtrip_local(tmp_path: Path) -> None:
    rows = fold({}, RECORDS)
    url = (tmp_path / "v" / "part.parquet").as_uri()
    size = write_version(url, rows_to_table(rows.values()))
    assert size == (tmp_path / "v" / "part.parquet").stat().st_size
    assert list((tmp_path / "v").iterdir()) == [tmp_path / "v" / "part.parquet"]  # no temp left
    back = read_version(url)
    assert back == {
        "a": Row(id="a", document="A", metadata={"j": "x"}, embedding=[0.25, 0.5]),
        "c": Row(id="c", document=None, metadata={"f": 1.5, "t": True}, embedding=[1.0]),
    }


def test_s3_read_fold_write_without_jvm(moto_endpoint: str, s3_bucket: str) -> None:
    s3 = S3Options.from_env({"AWS_ENDPOINT_URL": moto_endpoint, "AWS_REGION": "us-east-1"})
    boto = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    boto.put_object(Bucket=s3_bucket, Key="root/logs/c/1.parquet", Body=fragment(1, RECORDS[:3]))
    boto.put_object(Bucket=s3_bucket, Key="root/logs/c/4.parquet", Body=fragment(4, RECORDS[3:]))
    url1 = f"s3://{s3_bucket}/root/logs/c/1.parquet"
    url2 = f"s3://{s3_bucket}/root/logs/c/4.parquet"
    assert read_fragment(url1, s3).column("offset").to_pylist() == [1, 2, 3]

    items = []
    for url, start, limit in ((url1, 1, 4), (url2, 4, 6)):
        items += read_fragment_task(
            FragmentTask(cidx=0, url=url, start=start, limit=limit, lo=1, hi=6), s3
        )
    out_url = f"s3://{s3_bucket}/root/compacted/c/v0000000000000001/part-x.parquet"
    stats = fold_collection(
        FoldTask(cidx=0, collection_id="c", start=1, end=6, base_url=None, out_url=out_url),
        sorted(items),
        s3,
    )
    assert stats.error is None and (stats.records_in, stats.rows_out) == (5, 2)
    assert set(read_version(out_url, s3)) == {"a", "c"}
    key = "root/compacted/c/v0000000000000001/part-x.parquet"
    head = boto.head_object(Bucket=s3_bucket, Key=key)
    assert head["ContentLength"] == stats.bytes_out
    # Only the version file was created: no directory-marker objects in the store's key space.
    listed = boto.list_objects_v2(Bucket=s3_bucket, Prefix="root/compacted/")["Contents"]
    assert [o["Key"] for o in listed] == [key]


def test_fold_collection_reports_gaps_instead_of_writing(tmp_path: Path) -> None:
    frag = tmp_path / "f.parquet"
    frag.write_bytes(fragment(1, RECORDS))
    task = FragmentTask(cidx=0, url=frag.as_uri(), start=1, limit=6, lo=1, hi=6)
    items = read_fragment_task(task)
    out = tmp_path / "out.parquet"
    missing_middle = [kv for kv in items if kv[0][1] != 3]
    stats = fold_collection(FoldTask(0, "c", 1, 6, None, out.as_uri()), missing_middle)
    assert stats.error is not None and "expected offset 3" in stats.error
    short = fold_collection(FoldTask(0, "c", 1, 7, None, out.as_uri()), items)
    assert short.error is not None and "window ends at 7" in short.error
    assert not out.exists()
