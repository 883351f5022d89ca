"""Reading fragments and runs, and writing runs, by URL with pyarrow.

This module runs inside Spark executors, so it needs nothing but pyarrow and the standard library:
``file://`` URLs (and bare paths) are read with the local filesystem; ``s3://bucket/key`` URLs
with ``pyarrow.fs.S3FileSystem`` (pyarrow's bundled AWS SDK), so no Hadoop/JVM S3 jars are needed.

Where S3 is and how to sign in travel to executors in :class:`S3Options`, inside the Python
functions Spark ships with every task (the closures of ``mapInArrow`` and ``applyInArrow``): the
endpoint and region from the driver's environment, and — unless credentials are left to each
executor's own AWS chain — the credentials the driver resolved.  They are never Spark
configuration or environment variables, so neither the Spark UI nor its logs show them, and
``S3Options``'s ``repr`` leaves them out.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
    """Where S3 lives (endpoint, scheme, region) and, optionally, credentials to sign with
    (left out of ``repr``); picklable, so it reaches executors inside a task's closure."""

    endpoint_override: str | None = None
    scheme: str | None = None
    region: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, credentials: bool = False
    ) -> S3Options:
        """Options from ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` and ``AWS_REGION``; with
        ``credentials``, also the key pair (and session token) of ``AWS_ACCESS_KEY_ID``,
        ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, else of the profile ``AWS_PROFILE``
        names in the shared credentials and config files."""
        env = os.environ if env is None else env
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        keys: dict[str, str | None] = {}
        if credentials:
            keys = _credentials(env)
        if not endpoint:
            return cls(region=region, **keys)
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        return cls(endpoint_override=parts.netloc, scheme=parts.scheme, region=region, **keys)

    @property
    def has_credentials(self) -> bool:
        """Whether this carries credentials (else executors use their own AWS chain)."""
        return bool(self.access_key and self.secret_key)

    def filesystem(self) -> pafs.S3FileSystem:
        """A pyarrow S3 filesystem with these options: these credentials, or the executor's
        default AWS credential chain when there are none."""
        kwargs: dict[str, object] = {}
        if self.endpoint_override:
            kwargs["endpoint_override"] = self.endpoint_override
        if self.scheme:
            kwargs["scheme"] = self.scheme
        if self.region:
            kwargs["region"] = self.region
        if self.has_credentials:
            kwargs["access_key"] = self.access_key
            kwargs["secret_key"] = self.secret_key
            if self.session_token:
                kwargs["session_token"] = self.session_token
        return pafs.S3FileSystem(**kwargs)


def _credentials(env: Mapping[str, str]) -> dict[str, str | None]:
    """The driver's credentials: the environment's key pair, else its profile's from the
    shared files (botocore's file providers only: nothing here calls a network service)."""
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return {
            "access_key": key,
            "secret_key": secret,
            "session_token": env.get("AWS_SESSION_TOKEN"),
        }
    profile = env.get("AWS_PROFILE")
    if not profile:
        return {}
    from botocore.credentials import ConfigProvider, SharedCredentialProvider
    from botocore.session import Session

    session = Session(profile=profile)
    for provider in (
        SharedCredentialProvider(
            os.path.expanduser(session.get_config_variable("credentials_file")), profile
        ),
        ConfigProvider(os.path.expanduser(session.get_config_variable("config_file")), profile),
    ):
        creds = provider.load()
        if creds is not None:
            frozen = creds.get_frozen_credentials()
            return {
                "access_key": frozen.access_key,
                "secret_key": frozen.secret_key,
                "session_token": frozen.token,
            }
    return {}


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


def read_run(url: str, s3: S3Options | None = None) -> pa.Table:
    """A run (or a version of the single-version layout, read as a run of rows)."""
    from .runs import as_run

    fs, path = resolve(url, s3)
    return as_run(pq.read_table(path, filesystem=fs))


def run_footer(url: str, s3: S3Options | None = None) -> tuple[int, int]:
    """(rows, uncompressed bytes) of a Parquet file, from its footer alone."""
    fs, path = resolve(url, s3)
    with fs.open_input_file(path) as f:
        meta = pq.ParquetFile(f).metadata
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    return meta.num_rows, int(size)


def write_run(url: str, table: pa.Table, s3: S3Options | None = None) -> int:
    """Write a run so it is either absent or complete; returns its size in bytes."""
    return write_version(url, table, s3)
