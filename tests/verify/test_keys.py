"""verify/keys.py: the key patterns of the fault rules match what wal3.paths builds, and the tools
(verify/, bench/ and their tests) spell no key themselves either."""

from __future__ import annotations

import re
from pathlib import Path

from tests.wal3.test_paths import key_literals
from verify import keys
from wal3 import paths
from wal3.setsum import Setsum

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("verify", "bench", "tests/verify", "tests/helm")
TOP = ("tests/conftest.py", "tests/test_package_graph.py")

CID = "6d1f7a52-3c3e-4a5c-9d1e-0f2b7c9a1e01"
COLL = paths.log_prefix(CID)
DIRTY = paths.dirty_prefix("loghost-0")


def _in(prefix: str) -> dict[str, str]:
    return {
        "manifest": paths.join(prefix, paths.MANIFEST_PATH),
        "fragment": paths.join(prefix, paths.fragment_path(4097)),
        "snapshot": paths.join(prefix, paths.snapshot_path(Setsum.of(b"x"))),
        "cursor": paths.join(prefix, paths.cursor_path("stable_prefix")),
        "garbage": paths.join(prefix, paths.GARBAGE_PATH),
        "clock": paths.join(prefix, paths.CLOCK_PATH),
        "tenant": paths.join(prefix, paths.TENANT_PATH),
    }


def _matching(pattern: str | re.Pattern[str], keyset: dict[str, str]) -> set[str]:
    return {kind for kind, key in keyset.items() if re.search(pattern, key)}


def test_each_pattern_matches_its_kind_of_object_only() -> None:
    coll = _in(COLL)
    assert _matching(keys.in_any_log(keys.MANIFEST), coll) == {"manifest"}
    assert _matching(keys.in_any_log(keys.FRAGMENT), coll) == {"fragment"}
    assert _matching(keys.in_any_log(keys.SNAPSHOT), coll) == {"snapshot"}
    assert _matching(keys.in_any_log(keys.GARBAGE), coll) == {"garbage"}
    assert _matching(keys.in_any_log(keys.either(keys.GC, keys.CURSORS)), coll) == {
        "cursor",
        "garbage",
        "clock",
    }
    assert _matching(keys.cursor("stable_prefix"), coll) == {"cursor"}
    assert _matching(keys.cursor("compaction"), coll) == set()
    # A manifest-shaped key deeper in the tree is not the log's manifest.
    assert not re.search(keys.in_any_log(keys.MANIFEST), coll["manifest"] + ".old")


def test_the_server_logs_are_told_apart() -> None:
    coll, dirty = _in(COLL), _in(DIRTY)
    frag = keys.FRAGMENT
    assert _matching(keys.in_collection_log(frag), coll) == {"fragment"}
    assert _matching(keys.in_collection_log(frag), dirty) == set()
    assert _matching(keys.in_dirty_log(frag), dirty) == {"fragment"}
    assert _matching(keys.in_dirty_log(frag), coll) == set()
    either = keys.in_dirty_log(keys.either(keys.GARBAGE, keys.FRAGMENT, keys.SNAPSHOT))
    assert _matching(either, dirty) == {"garbage", "fragment", "snapshot"}
    # A log at another prefix is no server log.
    assert _matching(keys.in_collection_log(frag), _in("tests/" + COLL)) == set()


def test_server_log_captures_the_log_prefix() -> None:
    garbage = keys.server_log(keys.GARBAGE)
    for prefix in (COLL, DIRTY):
        m = garbage.match(_in(prefix)["garbage"])
        assert m is not None and m.group(1) == prefix
        assert keys.log_of(_in(prefix)["fragment"]) == prefix
    stable = keys.server_log(keys.cursor("stable_prefix"), dirty_only=True)
    m = stable.match(_in(DIRTY)["cursor"])
    assert m is not None and m.group(1) == DIRTY
    assert stable.match(_in(COLL)["cursor"]) is None


def test_no_key_is_spelled_in_the_tools() -> None:
    files = [f for d in TOOLS for f in sorted((ROOT / d).rglob("*.py"))]
    files += [ROOT / f for f in TOP]
    assert len(files) > 40
    found = {
        f"{f.relative_to(ROOT)}:{line}": value
        for f in files
        for line, value in key_literals(f.read_text(), str(f))
    }
    assert not found, "spell these keys with wal3.paths (patterns over keys: verify.keys)"
