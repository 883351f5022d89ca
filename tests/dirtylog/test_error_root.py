"""The dirty log's own errors share one documented root, ``dirtylog.errors.DirtyLogError`` (issue
18), and still are what existing callers catch."""

from __future__ import annotations

import inspect

import pytest

import dirtylog
from dirtylog import record as record_module
from dirtylog import rollup as rollup_module
from dirtylog.errors import DirtyLogError
from dirtylog.record import DirtyRecord, DirtyRecordError
from dirtylog.rollup import RollUpError


def test_every_error_class_the_dirty_log_defines_derives_from_the_root() -> None:
    import dirtylog.backend
    import dirtylog.coalesce
    import dirtylog.dirtyset
    import dirtylog.errors
    import dirtylog.hook
    import dirtylog.memory
    import dirtylog.selection
    import dirtylog.window

    mods = [
        record_module,
        rollup_module,
        dirtylog.backend,
        dirtylog.coalesce,
        dirtylog.dirtyset,
        dirtylog.errors,
        dirtylog.hook,
        dirtylog.memory,
        dirtylog.selection,
        dirtylog.window,
    ]
    defined = [
        c
        for m in mods
        for _, c in inspect.getmembers(m, inspect.isclass)
        if issubclass(c, BaseException) and c.__module__ == m.__name__
    ]
    assert {c.__name__ for c in defined} >= {"DirtyRecordError", "RollUpError"}
    for cls in defined:
        assert issubclass(cls, DirtyLogError), cls


def test_the_root_is_documented_and_exported() -> None:
    assert dirtylog.DirtyLogError is DirtyLogError
    assert DirtyLogError.__doc__ and inspect.getmodule(DirtyLogError).__doc__  # type: ignore[union-attr]


def test_existing_callers_catch_what_they_caught() -> None:
    assert issubclass(DirtyRecordError, ValueError)
    assert issubclass(RollUpError, Exception)
    with pytest.raises(ValueError):
        DirtyRecord.decode(b"short")
    with pytest.raises(DirtyLogError):
        DirtyRecord.decode(b"short")
