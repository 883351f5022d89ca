"""Reading fragments and compacted versions, and writing versions, by URL with pyarrow.

This module runs inside Spark executors, so it needs nothing but pyarrow and the standard library:
``file://`` URLs (and bare paths) are read with the local filesystem; ``s3://bucket/key`` URLs
with ``pyarrow.fs.S3FileSystem`` (pyarrow's bundled AWS SDK), so no Hadoop/JVM S3 jars are needed.
The S3 endpoint and region come from the driver's environment (``S3Options.from_env``); credentials
come from each executor's own AWS credential chain, so secrets are never shipped inside tasks.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .fold import Row, metadata_json

FRAGMENT_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.uint64(), nullable=False),
        pa.field("timestamp_us", pa.uint64(), nullable=False),
        pa.field("body", pa.binary(), nullable=False),
    ]
)

VERSION_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("document", pa.string()),
        pa.field("metadata", pa.string(), nullable=False),
        pa.field("embedding", pa.list_(pa.float32())),
    ]
)


@dataclass(frozen=True, slots=True)
class S3Options:
    """Where S3 lives (endpoint, scheme, region); picklable, carries no credentials."""

    endpoint_override: str | None = None
    scheme: str | None = None
    region: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Options:
        """Options from ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` and ``AWS_REGION``."""
        env = os.environ if env is None else env
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if not endpoint:
            return cls(region=region)
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        return cls(endpoint_override=parts.netloc, scheme=parts.scheme, region=region)

    def filesystem(self) -> pafs.S3FileSystem:
        """A pyarrow S3 filesystem with these options and the default credential chain."""
        kwargs: dict[str, object] = {}
        if self.endpoint_override:
            kwargs["endpoint_override"] = self.endpoint_override
        if self.scheme:
            kwargs["scheme"] = self.scheme
        if self.region:
            kwargs["region"] = self.region
        return pafs.S3FileSystem(**kwargs)  # type: ignore[arg-type]


def resolve(url: str, s3: S3Options | None = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem and filesystem path of a ``file://``, bare-path or ``s3://`` URL."""
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        path = url2pathname(parts.path) if parts.scheme == "file" else url
        return pafs.LocalFileSystem(), path
    if parts.scheme == "s3":
        key = unquote(parts.path.lstrip("/"))
        return (s3 or S3Options()).filesystem(), f"{parts.netloc}/{key}"
    raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}")


def read_bytes(url: str, s3: S3Options | None = None) -> bytes:
    """An object's bytes (a fragment is verified whole before it is decoded)."""
    fs, path = resolve(url, s3)
    with fs.open_input_file(path) as f:
        return f.read()


def read_fragment(url: str, s3: S3Options | None = None) -> pa.Table:
    """A fragment's ``offset`` and ``body`` columns."""
    fs, path = resolve(url, s3)
    return pq.read_table(path, filesystem=fs, columns=["offset", "body"])


def rows_to_table(rows: Iterable[Row]) -> pa.Table:
    """Rows as a version table, sorted by id so a version's bytes are deterministic."""
    ordered = sorted(rows, key=lambda r: r.id)
    return pa.table(
        {
            "id": pa.array([r.id for r in ordered], pa.string()),
            "document": pa.array([r.document for r in ordered], pa.string()),
            "metadata": pa.array([metadata_json(r.metadata) for r in ordered], pa.string()),
            "embedding": pa.array([r.embedding for r in ordered], pa.list_(pa.float32())),
        },
        schema=VERSION_SCHEMA,
    )


def table_to_rows(table: pa.Table) -> dict[str, Row]:
    """A version table back as rows keyed by id."""
    cols = table.select(["id", "document", "metadata", "embedding"]).to_pydict()
    return {
        rid: Row(id=rid, document=doc, metadata=json.loads(md) if md else {}, embedding=emb)
        for rid, doc, md, emb in zip(
            cols["id"], cols["document"], cols["metadata"], cols["embedding"], strict=True
        )
    }


def read_version(url: str, s3: S3Options | None = None) -> dict[str, Row]:
    """Every row of a compacted version's Parquet file."""
    fs, path = resolve(url, s3)
    return table_to_rows(pq.read_table(path, filesystem=fs))


def write_version(url: str, table: pa.Table, s3: S3Options | None = None) -> int:
    """Write a version's Parquet file so it is either absent or complete; returns its size."""
    fs, path = resolve(url, s3)
    if isinstance(fs, pafs.LocalFileSystem):
        return _write_local_durably(path, table)
    # An S3 object becomes visible only when the upload completes: never torn.
    pq.write_table(table, path, filesystem=fs, compression="snappy")
    return int(fs.get_file_info(path).size)


def _write_local_durably(path: str, table: pa.Table) -> int:
    # Temp file + fsync + rename + directory fsync: CURRENT.json may point here right after, and
    # a crash must not leave it pointing at a torn or empty file.
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="snappy")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return os.path.getsize(path)
