"""The root of the dirty log's own errors.

Every error class the dirty log defines derives from :class:`DirtyLogError`, so a caller can catch
everything the dirty log itself complains about in one clause.  Classes that were ``ValueError``s
stay ``ValueError``s as well (:class:`~dirtylog.record.DirtyRecordError`), so existing handlers
catch what they caught.  Engine errors the dirty log lets through (``wal3.errors``: a lost cursor
compare-and-swap, a purged offset, a store failure) are not wrapped: they keep their own root,
``wal3.errors.Wal3Error``.
"""

from __future__ import annotations


class DirtyLogError(Exception):
    """Base class of every error the dirty log defines (a bad record, a broken contract)."""


class RollUpError(DirtyLogError):
    """The dirty log violated its contract (a gap, or a short read before the end), or a roll-up
    was about to move its cursor past a record a dirty collection still depends on."""
