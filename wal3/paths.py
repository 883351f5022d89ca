"""Every object key the system writes or reads, spelled in one place.

Other programs read these keys (Chroma's Rust wal3 reads a log's manifest, snapshots, fragments,
cursors and ``gc/GARBAGE``; compactors and operators read the rest), so their bytes are a format:
``tests/wal3/test_paths.py`` pins each spelling, and fails if a key literal appears anywhere in
``wal3/``, ``host/``, ``dirtylog/`` or ``compactor_client/`` but here.  docs/DESIGN.md, "Objects
in the store", describes what each object holds.

Two kinds of key:

* **Inside a log**, relative to the log's prefix (``manifest/MANIFEST``, ``log/...``,
  ``snapshot/...``, ``cursor/...``, ``gc/...``, ``TENANT``, ``CLAIM``); :func:`join` puts them
  under a prefix.  A log may live at any prefix (tests and tools use arbitrary ones).
* **From the store's root**: where the server keeps its logs (:func:`log_prefix`,
  :func:`dirty_prefix`), the compactors' output (``compacted/...``) and their bookkeeping
  (``compactors/...``).

This module depends on nothing else in the package, so every module may use it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote
from uuid import UUID

if TYPE_CHECKING:
    from .setsum import Setsum

_U64_MAX = (1 << 64) - 1  # Rust's u64: fragment sequence numbers end here


def join(prefix: str, path: str) -> str:
    """The store key of ``path`` inside the log rooted at ``prefix`` (``prefix`` may be empty,
    and slashes around it are dropped)."""
    prefix = prefix.strip("/")
    return f"{prefix}/{path}" if prefix else path


# --- Inside a log (relative to its prefix) --------------------------------------------------

MANIFEST_PATH = "manifest/MANIFEST"
"""The log's root manifest, rewritten by conditional put."""

SNAPSHOT_PREFIX = "snapshot/"
"""Where the manifest tree's interior nodes (immutable, content-addressed) live."""

_SNAPSHOT_RE = re.compile(re.escape(SNAPSHOT_PREFIX) + r"SNAPSHOT\.[0-9a-f]{64}")


def snapshot_path(setsum: Setsum) -> str:
    """``snapshot/SNAPSHOT.{setsum}``: the content-addressed path of a snapshot."""
    return f"{SNAPSHOT_PREFIX}SNAPSHOT.{setsum.hexdigest()}"


def is_snapshot_path(path: str) -> bool:
    """Whether ``path`` (relative to a log's prefix) names a snapshot of that log (and not an
    object of another log nested under it)."""
    return _SNAPSHOT_RE.fullmatch(path) is not None


LOG_PREFIX = "log/"
"""Where a log's fragments live."""

BUCKET_SIZE = 4096
"""Fragments per ``Bucket=`` directory: fragment ``seq`` is in bucket ``seq - seq % 4096``."""

_FRAGMENT_RE = re.compile(
    r"^" + re.escape(LOG_PREFIX) + r"Bucket=([0-9a-f]{16})/FragmentSeqNo=([0-9a-f]{16})\.parquet$"
)


def fragment_path(seq_no: int) -> str:
    """``log/Bucket={b:016x}/FragmentSeqNo={seq:016x}.parquet``: the path of fragment
    ``seq_no``, relative to the log's prefix.  Raises ValueError outside 1..2**64-1."""
    if seq_no < 1:
        raise ValueError("fragment sequence numbers start at 1")
    if seq_no > _U64_MAX:
        raise ValueError(f"fragment sequence numbers end at {_U64_MAX} (u64)")
    bucket = seq_no - seq_no % BUCKET_SIZE
    return f"{LOG_PREFIX}Bucket={bucket:016x}/FragmentSeqNo={seq_no:016x}.parquet"


def parse_fragment_path(path: str) -> int | None:
    """The sequence number named by a fragment path, or None if it is not one (including a
    path whose bucket is not its sequence number's)."""
    m = _FRAGMENT_RE.match(path)
    if m is None:
        return None
    bucket, seq = int(m.group(1), 16), int(m.group(2), 16)
    if bucket != seq - seq % BUCKET_SIZE:
        return None
    return seq


CURSOR_PREFIX = "cursor/"
"""Where a log's cursors live, one object each."""

_CURSOR_SUFFIX = ".json"


def cursor_path(name: str) -> str:
    """``cursor/{name}.json``, relative to the log's prefix.  The name is not checked here
    (``wal3.cursors.check_cursor_name`` does that)."""
    return f"{CURSOR_PREFIX}{name}{_CURSOR_SUFFIX}"


def cursor_name(rest: str) -> str | None:
    """The cursor name of ``rest``, a key with its ``.../cursor/`` prefix taken off; None when
    it is not a cursor object (another suffix, or deeper in the tree)."""
    if rest.endswith(_CURSOR_SUFFIX) and "/" not in rest:
        return rest[: -len(_CURSOR_SUFFIX)]
    return None


GC_PREFIX = "gc/"
"""Where the garbage collector's objects live."""

GARBAGE_PATH = f"{GC_PREFIX}GARBAGE"
"""The collector's plan, in Rust wal3's schema."""

# The collector's store-clock objects (ours; Rust's collector reads only gc/GARBAGE): CLOCK is
# rewritten to read the store's "now" (its Last-Modified), never a local clock; OLDEST records an
# oldest offset the collector saw, dated by its own Last-Modified.
CLOCK_PATH = f"{GC_PREFIX}CLOCK"
"""The collector's probe of the store's clock."""

OLDEST_PATH = f"{GC_PREFIX}OLDEST"
"""The oldest offset the orphan sweep saw, dated by the object's Last-Modified."""

TENANT_PATH = "TENANT"
"""The tenant that first wrote the log (the server's; written create-only)."""

CLAIM_PATH = "CLAIM"
"""The claim on creating the log (a fork into it, or its first write)."""


# --- From the store's root ------------------------------------------------------------------

LOGS_PREFIX = "logs/"
"""Where the server keeps its collections' logs."""


def log_prefix(collection_id: UUID | str) -> str:
    """``logs/{collection_id}``: where a collection's log lives in the store."""
    return f"{LOGS_PREFIX}{collection_id}"


DIRTY_PREFIX = "dirty/"
"""Where the servers keep their dirty logs."""


def dirty_prefix(server_id: str) -> str:
    """``dirty/{server_id}``: where a server's dirty log lives in the store."""
    return f"{DIRTY_PREFIX}{server_id}"


def dirty_server_id(prefix: str) -> str | None:
    """The server id of a dirty log's prefix, or None when ``prefix`` is not one."""
    if not prefix.startswith(DIRTY_PREFIX) or len(prefix) == len(DIRTY_PREFIX):
        return None
    return prefix[len(DIRTY_PREFIX) :]


COMPACTED_PREFIX = "compacted/"
"""Where the compactors' output lives, one directory per collection."""

CURRENT_NAME = "CURRENT.json"
"""A collection's pointer to its installed compacted version."""

# A version's data file, relative to its collection's directory: v{version:016d}/part-*.parquet.
_DATA_KEY_RE = re.compile(r"^v(\d{16})/part-[^/]+\.parquet$")


def compacted_prefix(collection_id: UUID | str) -> str:
    """``compacted/{collection_id}/``: everything the compactors keep of a collection, its
    versions and ``CURRENT.json``."""
    return f"{COMPACTED_PREFIX}{collection_id}/"


def current_key(collection_id: UUID | str) -> str:
    """``compacted/{collection_id}/CURRENT.json``: the key of a collection's pointer."""
    return f"{compacted_prefix(collection_id)}{CURRENT_NAME}"


def version_prefix(collection_id: UUID | str, version: int) -> str:
    """``compacted/{collection_id}/v{version:016d}/``: the directory of one version."""
    return f"{compacted_prefix(collection_id)}v{version:016d}/"


def data_key(collection_id: UUID | str, version: int, token: str) -> str:
    """``compacted/{collection_id}/v{version:016d}/part-{token}.parquet``: the data file one
    install attempt writes for a version (the token keeps racing attempts' files apart)."""
    return f"{version_prefix(collection_id, version)}part-{token}.parquet"


def copied_compacted_key(key: str, source: UUID | str, target: UUID | str) -> str | None:
    """Where ``key``, an object under ``compacted/{source}/``, goes when it is copied into
    ``compacted/{target}/`` (a fork copies the source's installed version this way): the same
    path relative to the collection's directory.  None when ``key`` is not an object under
    ``source``'s directory."""
    base = compacted_prefix(source)
    if not key.startswith(base) or len(key) == len(base):
        return None
    return compacted_prefix(target) + key[len(base) :]


def parse_data_key(collection_id: UUID | str, key: str) -> int | None:
    """The version whose data file ``key`` is, or None when it is not one of this
    collection's data files."""
    base = compacted_prefix(collection_id)
    if not key.startswith(base):
        return None
    m = _DATA_KEY_RE.match(key[len(base) :])
    return int(m.group(1)) if m is not None else None


# A sorted run of the leveled layout (issue 15), relative to its collection's directory: it lives
# in the directory of the version whose install attempt wrote it, and stays listed by CURRENT.json
# for as many versions as it is live.
_RUN_KEY_RE = re.compile(r"^v(\d{16})/run-[^/]+\.parquet$")


def run_key(collection_id: UUID | str, version: int, token: str) -> str:
    """``compacted/{collection_id}/v{version:016d}/run-{token}.parquet``: one sorted run written
    by an install attempt for ``version`` (a new top run, or the output of a merge)."""
    return f"{version_prefix(collection_id, version)}run-{token}.parquet"


def parse_run_key(collection_id: UUID | str, key: str) -> int | None:
    """The version whose install attempt wrote the run ``key``, or None when it is not one of
    this collection's runs."""
    base = compacted_prefix(collection_id)
    if not key.startswith(base):
        return None
    m = _RUN_KEY_RE.match(key[len(base) :])
    return int(m.group(1)) if m is not None else None


def parse_compacted_key(collection_id: UUID | str, key: str) -> int | None:
    """The version directory of any of this collection's compacted data files (a version's
    ``part-*`` file of the single-version layout, or a ``run-*`` of the leveled one), else None."""
    of = parse_data_key(collection_id, key)
    return of if of is not None else parse_run_key(collection_id, key)


COMPACTORS_PROGRESS_PREFIX = "compactors/progress/"
"""Where each compactor keeps its take-over clocks."""

COMPACTORS_LIVE_PREFIX = "compactors/live/"
"""Where each compactor keeps its heartbeat."""

_MEMBER_SUFFIX = ".json"


def _member_key(prefix: str, member_id: str) -> str:
    # The id is quoted: it is one key segment, never a path.
    return f"{prefix}{quote(member_id, safe='')}{_MEMBER_SUFFIX}"


def progress_key(member_id: str) -> str:
    """``compactors/progress/{quoted member_id}.json``: a compactor's take-over clocks."""
    return _member_key(COMPACTORS_PROGRESS_PREFIX, member_id)


def live_key(member_id: str) -> str:
    """``compactors/live/{quoted member_id}.json``: a compactor's heartbeat."""
    return _member_key(COMPACTORS_LIVE_PREFIX, member_id)


HOSTS_LIVE_PREFIX = "hosts/live/"
"""Where each log host keeps its liveness record (host membership: routing and adoption)."""


def host_live_key(server_id: str) -> str:
    """``hosts/live/{quoted server_id}.json``: a log host's liveness record."""
    return _member_key(HOSTS_LIVE_PREFIX, server_id)


def parse_host_live_key(key: str) -> str | None:
    """The server id of a host liveness record's key, or None when ``key`` is not one."""
    return _parse_member_key(HOSTS_LIVE_PREFIX, key)


def _parse_member_key(prefix: str, key: str) -> str | None:
    if not key.startswith(prefix):
        return None
    name = key[len(prefix) :]
    if not name.endswith(_MEMBER_SUFFIX) or "/" in name:
        return None
    return unquote(name[: -len(_MEMBER_SUFFIX)])


def parse_live_key(key: str) -> str | None:
    """The member id of a heartbeat's key, or None when ``key`` is not one."""
    return _parse_member_key(COMPACTORS_LIVE_PREFIX, key)
