"""Patterns over object keys, for fault rules and store observers, built from :mod:`wal3.paths`.

The harness, the simulator and their tests aim faults at kinds of object ("a manifest put of a
collection's log", "a fragment of the dirty log"): these are the regular expressions they use,
each assembled from the spellings in ``wal3.paths``, so no key is written down twice.  A pattern
is searched for in a key (``FaultRule.key_regex``); ``in_any_log`` matches under any prefix,
``in_collection_log`` and ``in_dirty_log`` only in the server's own logs.
"""

from __future__ import annotations

import re

from wal3 import paths

SEGMENT = "[^/]+"
"""One segment of a key (a collection id, a server id)."""

MANIFEST = re.escape(paths.MANIFEST_PATH) + "$"
"""A log's root manifest."""

FRAGMENT = re.escape(paths.LOG_PREFIX)
"""A log's fragments (nothing else lives under ``log/``)."""

SNAPSHOT = re.escape(paths.SNAPSHOT_PREFIX)
"""A log's snapshots (nothing else lives under ``snapshot/``)."""

CURSORS = re.escape(paths.CURSOR_PREFIX)
"""A log's cursors."""

GC = re.escape(paths.GC_PREFIX)
"""The collector's objects (its plan, its clock probes)."""

GARBAGE = re.escape(paths.GARBAGE_PATH) + "$"
"""The collector's plan."""


def cursor(name: str) -> str:
    """The cursor called ``name``."""
    return re.escape(paths.cursor_path(name)) + "$"


def either(*patterns: str) -> str:
    """Any one of ``patterns`` (each a pattern of this module)."""
    return "(?:" + "|".join(patterns) + ")"


def in_any_log(pattern: str) -> str:
    """``pattern`` inside a log at any (non-empty) prefix."""
    return "/" + pattern


def in_collection_log(pattern: str) -> str:
    """``pattern`` inside a collection's log (``logs/{cid}/...``)."""
    return "^" + re.escape(paths.LOGS_PREFIX) + SEGMENT + "/" + pattern


def in_dirty_log(pattern: str) -> str:
    """``pattern`` inside a server's dirty log (``dirty/{server_id}/...``)."""
    return "^" + re.escape(paths.DIRTY_PREFIX) + SEGMENT + "/" + pattern


def server_log(pattern: str, *, dirty_only: bool = False) -> re.Pattern[str]:
    """``pattern`` inside a collection's or a dirty log (``dirty_only``: a dirty log), with the
    log's prefix as group 1."""
    dirty = re.escape(paths.DIRTY_PREFIX)
    roots = dirty if dirty_only else either(re.escape(paths.LOGS_PREFIX), dirty)
    return re.compile("^(" + roots + SEGMENT + ")/" + pattern)


def log_of(key: str) -> str:
    """The prefix of the server's log (``logs/{cid}`` or ``dirty/{server_id}``) holding ``key``."""
    return "/".join(key.split("/")[:2])
