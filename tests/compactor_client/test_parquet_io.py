"""Executor-side I/O by URL: local files and S3 through pyarrow (moto over HTTP, no JVM)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactor_client import runs
from compactor_client.executor import (
    FoldTask,
    FragmentTask,
    fold_collection,
    fold_locally,
    read_fragment,
)
from compactor_client.fold import Row, fold
from compactor_client.parquet_io import (
    S3Options,
    read_run,
    read_version,
    resolve,
    rows_to_table,
    write_version,
)
from compactor_client.parquet_io import read_fragment as read_fragment_file

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


def test_s3_options_carry_credentials_only_when_asked_and_never_show_them() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
        "AWS_SESSION_TOKEN": "t0ken-value",
    }
    assert not S3Options.from_env(env).has_credentials
    opts = S3Options.from_env(env, credentials=True)
    assert opts.has_credentials and opts.session_token == "t0ken-value"
    for shown in (repr(opts), str(opts)):
        assert "s3cr3t" not in shown and "t0ken" not in shown and "AKID" not in shown
    import pickle

    assert pickle.loads(pickle.dumps(opts)) == opts  # it travels inside task closures


def test_s3_options_read_a_profile_from_the_shared_files(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.write_text("[ci]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = fromfile\n")
    env = {
        "AWS_PROFILE": "ci",
        "AWS_SHARED_CREDENTIALS_FILE": str(creds),
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
    }
    import os

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        opts = S3Options.from_env(env, credentials=True)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert (opts.access_key, opts.secret_key) == ("AKIDPROFILE", "fromfile")


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
    assert read_fragment_file(url1, s3).column("offset").to_pylist() == [1, 2, 3]

    frags = [
        FragmentTask(cidx=0, url=url, start=start, limit=limit, lo=1, hi=6)
        for url, start, limit in ((url1, 1, 4), (url2, 4, 6))
    ]
    key = "root/compacted/c/v0000000000000001/run-x-0.parquet"
    out_url = f"s3://{s3_bucket}/{key}"
    stats = fold_locally(FoldTask(0, "c", 1, 6, outputs=((out_url, key),)), frags, s3)
    assert stats.error is None and (stats.records_in, stats.rows_out) == (5, 2)
    assert [(r.key, r.rows, r.written) for r in stats.runs] == [(key, 2, True)]
    state = runs.materialize([read_run(out_url, s3)])
    assert state.column("id").to_pylist() == ["a", "c"]
    head = boto.head_object(Bucket=s3_bucket, Key=key)
    assert head["ContentLength"] == stats.bytes_out
    # Only the run was created: no directory-marker objects in the store's key space.
    listed = boto.list_objects_v2(Bucket=s3_bucket, Prefix="root/compacted/")["Contents"]
    assert [o["Key"] for o in listed] == [key]


def test_fold_collection_reports_gaps_instead_of_writing(tmp_path: Path) -> None:
    frag = tmp_path / "f.parquet"
    frag.write_bytes(fragment(1, RECORDS))
    recs = read_fragment(FragmentTask(cidx=0, url=frag.as_uri(), start=1, limit=6, lo=1, hi=6))
    out = tmp_path / "out.parquet"
    outputs = ((out.as_uri(), "k"),)
    missing_middle = recs.filter(pa.compute.not_equal(recs.column("offset"), 3))
    stats = fold_collection(FoldTask(0, "c", 1, 6, outputs=outputs), missing_middle)
    assert stats.error is not None and "first missing 3" in stats.error
    assert stats.error_kind == "gap"
    short = fold_collection(FoldTask(0, "c", 1, 7, outputs=outputs), recs)
    assert short.error is not None and "first missing 6" in short.error
    assert not out.exists()
