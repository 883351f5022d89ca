"""The compactor's own errors share one documented root, ``compactor_client.errors.CompactorError``
(issue 18), and still are what existing callers catch."""

from __future__ import annotations

import importlib
import inspect

import pytest

import compactor_client
from compactor_client import errors
from compactor_client.errors import CompactorError, LogHostError, error_class

# Modules that define error classes (sparkutil and the CLI import pyspark/httpx lazily only).
MODULES = [
    "errors",
    "cli",
    "integrity",
    "executor",
    "versions",
    "fold",
    "pipeline",
    "scheduler",
    "membership",
    "client",
    "models",
    "parquet_io",
    "metrics",
    "stores",
]


def test_every_error_class_the_package_defines_derives_from_the_root() -> None:
    defined = []
    for name in MODULES:
        mod = importlib.import_module(f"compactor_client.{name}")
        defined += [
            c
            for _, c in inspect.getmembers(mod, inspect.isclass)
            if issubclass(c, BaseException) and c.__module__ == mod.__name__
        ]
    names = {c.__name__ for c in defined}
    assert names >= {
        "LogHostError",
        "SettingsError",
        "CorruptFragmentError",
        "UnverifiableFragmentError",
        "GapError",
        "FoldError",
        "CorruptCurrent",
        "InvalidRecord",
        "PlanError",
    }, names
    for cls in defined:
        assert issubclass(cls, CompactorError), cls


def test_the_root_is_documented_and_exported() -> None:
    assert compactor_client.CompactorError is CompactorError
    assert CompactorError.__doc__ and errors.__doc__ and "CompactorError" in errors.__doc__


def test_existing_callers_catch_what_they_caught() -> None:
    from compactor_client.cli import SettingsError
    from compactor_client.executor import GapError
    from compactor_client.fold import InvalidRecord
    from compactor_client.integrity import (
        CorruptFragmentError,
        UnverifiableFragmentError,
    )
    from compactor_client.versions import CorruptCurrent

    for cls in (
        SettingsError,
        GapError,
        InvalidRecord,
        CorruptFragmentError,
        UnverifiableFragmentError,
        CorruptCurrent,
    ):
        assert issubclass(cls, ValueError), cls
    assert issubclass(LogHostError, CompactorError)
    with pytest.raises(LogHostError):
        raise error_class(409, "contention")("raced", status=409)


def test_the_client_maps_only_what_the_server_sends() -> None:
    # The server answers invalid input with 400 (never FastAPI's 422): no 422 mapping is kept.
    assert 422 not in errors._BY_STATUS
    assert error_class(400, "invalid_request") is errors.InvalidRequest
    assert error_class(500, "corrupt_fragment") is errors.CorruptFragment
    assert error_class(500, "data_loss") is errors.ServerError
