"""wal3.paths owns every object key (issue 18).

Other programs read these keys (Chroma's Rust wal3, compactors of other versions, operators'
tools), so each spelling is pinned here byte for byte; and no key may be spelled anywhere else in
the packages, or the two spellings could drift apart.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from uuid import UUID

import pytest

from wal3 import paths
from wal3.setsum import Setsum

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("wal3", "host", "dirtylog", "compactor_client")
OWNER = ROOT / "wal3" / "paths.py"

CID = UUID("0123abcd-0000-4000-8000-00000000beef")


# --- Each key's exact spelling ------------------------------------------------------------------


def test_join() -> None:
    assert paths.join("logs/x", "manifest/MANIFEST") == "logs/x/manifest/MANIFEST"
    assert paths.join("/logs/x/", "CLAIM") == "logs/x/CLAIM"
    assert paths.join("", "manifest/MANIFEST") == "manifest/MANIFEST"
    assert paths.join("/", "gc/GARBAGE") == "gc/GARBAGE"


def test_keys_inside_a_log() -> None:
    assert paths.MANIFEST_PATH == "manifest/MANIFEST"
    assert paths.SNAPSHOT_PREFIX == "snapshot/"
    assert paths.LOG_PREFIX == "log/"
    assert paths.CURSOR_PREFIX == "cursor/"
    assert paths.GC_PREFIX == "gc/"
    assert paths.GARBAGE_PATH == "gc/GARBAGE"
    assert paths.CLOCK_PATH == "gc/CLOCK"
    assert paths.OLDEST_PATH == "gc/OLDEST"
    assert paths.TENANT_PATH == "TENANT"
    assert paths.CLAIM_PATH == "CLAIM"


def test_snapshot_path() -> None:
    s = Setsum.of_digests(b"\x01" * 32)
    hexd = s.hexdigest()
    assert len(hexd) == 64
    assert paths.snapshot_path(s) == f"snapshot/SNAPSHOT.{hexd}"
    assert paths.snapshot_path(Setsum()) == "snapshot/SNAPSHOT." + "0" * 64
    assert paths.is_snapshot_path(paths.snapshot_path(s))
    for not_one in (
        "manifest/MANIFEST",
        "snapshot/SNAPSHOT." + "0" * 63,
        "snapshot/SNAPSHOT." + "A" * 64,
        "x/snapshot/SNAPSHOT." + "0" * 64,
        "snapshot/SNAPSHOT." + "0" * 64 + "\n",
        "../x",
        "",
    ):
        assert not paths.is_snapshot_path(not_one), not_one


def test_fragment_path() -> None:
    assert paths.BUCKET_SIZE == 4096
    assert (
        paths.fragment_path(1)
        == "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000001.parquet"
    )
    assert (
        paths.fragment_path(4095)
        == "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000fff.parquet"
    )
    assert (
        paths.fragment_path(4096)
        == "log/Bucket=0000000000001000/FragmentSeqNo=0000000000001000.parquet"
    )
    assert (
        paths.fragment_path(0x12345)
        == "log/Bucket=0000000000012000/FragmentSeqNo=0000000000012345.parquet"
    )
    top = (1 << 64) - 1
    assert (
        paths.fragment_path(top)
        == "log/Bucket=fffffffffffff000/FragmentSeqNo=ffffffffffffffff.parquet"
    )
    for bad in (0, -1, 1 << 64):
        with pytest.raises(ValueError):
            paths.fragment_path(bad)


@pytest.mark.parametrize("seq", [1, 2, 4095, 4096, 4097, 0x12345, (1 << 64) - 1])
def test_parse_fragment_path_round_trips(seq: int) -> None:
    assert paths.parse_fragment_path(paths.fragment_path(seq)) == seq


@pytest.mark.parametrize(
    "path",
    [
        "log/Bucket=0000000000001000/FragmentSeqNo=0000000000000001.parquet",  # wrong bucket
        "log/Bucket=0000000000000000/FragmentSeqNo=000000000000001.parquet",  # 15 digits
        "log/Bucket=0000000000000000/FragmentSeqNo=000000000000000A.parquet",  # upper case
        "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000001.parquet.tmp",
        "x/log/Bucket=0000000000000000/FragmentSeqNo=0000000000000001.parquet",
        "log/Uuid=0123abcd-0000-4000-8000-00000000beef.parquet",  # Rust's newer names: not ours
        "manifest/MANIFEST",
        "",
    ],
)
def test_parse_fragment_path_refuses(path: str) -> None:
    assert paths.parse_fragment_path(path) is None


def test_cursor_path() -> None:
    assert paths.cursor_path("compaction") == "cursor/compaction.json"
    assert paths.cursor_path("stable_prefix") == "cursor/stable_prefix.json"
    assert paths.cursor_name("compaction.json") == "compaction"
    assert paths.cursor_name("a/b.json") is None
    assert paths.cursor_name("compaction.json.tmp") is None
    assert paths.cursor_name("compaction") is None


def test_log_roots() -> None:
    assert paths.LOGS_PREFIX == "logs/"
    assert paths.log_prefix(CID) == "logs/0123abcd-0000-4000-8000-00000000beef"
    assert paths.log_prefix(str(CID)) == paths.log_prefix(CID)
    assert (
        paths.join(paths.log_prefix(CID), paths.MANIFEST_PATH)
        == "logs/0123abcd-0000-4000-8000-00000000beef/manifest/MANIFEST"
    )
    assert paths.join(paths.log_prefix(CID), paths.fragment_path(7)) == (
        "logs/0123abcd-0000-4000-8000-00000000beef/"
        "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000007.parquet"
    )
    assert paths.DIRTY_PREFIX == "dirty/"
    assert paths.dirty_prefix("host-1") == "dirty/host-1"
    assert paths.dirty_server_id("dirty/host-1") == "host-1"
    assert paths.dirty_server_id(paths.dirty_prefix("a.b")) == "a.b"
    assert paths.dirty_server_id("dirty/") is None
    assert paths.dirty_server_id("logs/host-1") is None
    assert (
        paths.join(paths.dirty_prefix("h"), paths.cursor_path("stable_prefix"))
        == "dirty/h/cursor/stable_prefix.json"
    )


def test_compacted_layout() -> None:
    cid = "0123abcd-0000-4000-8000-00000000beef"
    assert paths.COMPACTED_PREFIX == "compacted/"
    assert paths.CURRENT_NAME == "CURRENT.json"
    assert paths.compacted_prefix(CID) == f"compacted/{cid}/"
    assert paths.current_key(CID) == f"compacted/{cid}/CURRENT.json"
    assert paths.current_key(cid) == paths.current_key(CID)
    assert paths.version_prefix(cid, 7) == f"compacted/{cid}/v0000000000000007/"
    assert paths.data_key(cid, 7, "ab12") == f"compacted/{cid}/v0000000000000007/part-ab12.parquet"
    assert paths.data_key(CID, 10**15, "t") == f"compacted/{cid}/v1000000000000000/part-t.parquet"
    assert paths.parse_data_key(cid, paths.data_key(cid, 7, "ab12")) == 7
    for not_one in (
        paths.current_key(cid),
        f"compacted/{cid}/v7/part-a.parquet",
        f"compacted/{cid}/v0000000000000007/part-a.json",
        f"compacted/{cid}/v0000000000000007/x/part-a.parquet",
        "compacted/other/v0000000000000007/part-a.parquet",
    ):
        assert paths.parse_data_key(cid, not_one) is None, not_one


def test_leveled_run_keys() -> None:
    cid = "0123abcd-0000-4000-8000-00000000beef"
    assert paths.run_key(cid, 7, "ab12") == f"compacted/{cid}/v0000000000000007/run-ab12.parquet"
    assert paths.run_key(CID, 10**15, "t") == f"compacted/{cid}/v1000000000000000/run-t.parquet"
    assert paths.parse_run_key(cid, paths.run_key(cid, 7, "ab12")) == 7
    assert paths.parse_compacted_key(cid, paths.run_key(cid, 7, "x")) == 7
    assert paths.parse_compacted_key(cid, paths.data_key(cid, 9, "x")) == 9
    assert paths.parse_run_key(cid, paths.data_key(cid, 9, "x")) is None
    assert paths.parse_data_key(cid, paths.run_key(cid, 9, "x")) is None
    for not_one in (
        paths.current_key(cid),
        f"compacted/{cid}/v7/run-a.parquet",
        f"compacted/{cid}/v0000000000000007/run-a.json",
        f"compacted/{cid}/v0000000000000007/x/run-a.parquet",
        "compacted/other/v0000000000000007/run-a.parquet",
    ):
        assert paths.parse_compacted_key(cid, not_one) is None, not_one


def test_copied_compacted_key() -> None:
    src, dst = "0123abcd-0000-4000-8000-00000000beef", UUID(int=7, version=4)
    key = paths.data_key(src, 7, "ab12")
    assert paths.copied_compacted_key(key, src, dst) == paths.data_key(dst, 7, "ab12")
    assert (
        paths.copied_compacted_key(key, CID, dst)
        == f"compacted/{dst}/v0000000000000007/part-ab12.parquet"
    )
    for not_one in (
        paths.compacted_prefix(src),  # the directory itself
        paths.data_key(dst, 7, "ab12"),  # another collection's
        "x/" + key,  # under the directory only somewhere inside the key
        f"compacted/{src}",
    ):
        assert paths.copied_compacted_key(not_one, src, dst) is None, not_one


def test_compactor_keys() -> None:
    assert paths.COMPACTORS_PROGRESS_PREFIX == "compactors/progress/"
    assert paths.COMPACTORS_LIVE_PREFIX == "compactors/live/"
    assert paths.progress_key("c1") == "compactors/progress/c1.json"
    assert paths.live_key("c1") == "compactors/live/c1.json"
    # The id is one key segment, never a path.
    assert paths.live_key("a/b c") == "compactors/live/a%2Fb%20c.json"
    assert paths.progress_key("a/b c") == "compactors/progress/a%2Fb%20c.json"
    assert paths.parse_live_key(paths.live_key("a/b c")) == "a/b c"
    for not_one in (
        "compactors/live/x/y.json",
        "compactors/live/x.txt",
        "compactors/progress/c1.json",
    ):
        assert paths.parse_live_key(not_one) is None, not_one


def test_old_names_are_the_paths_modules() -> None:
    """Older public names stay, but only as the paths module's own objects."""
    from compactor_client import membership, scheduler, versions
    from host import dirty, forks, manager
    from wal3 import claim, fragment, layout, manifest

    assert manifest.MANIFEST_PATH is paths.MANIFEST_PATH
    assert manifest.SNAPSHOT_PREFIX is paths.SNAPSHOT_PREFIX
    assert manifest.snapshot_path is paths.snapshot_path
    assert fragment.fragment_path is paths.fragment_path
    assert fragment.parse_fragment_path is paths.parse_fragment_path
    assert fragment.BUCKET_SIZE == paths.BUCKET_SIZE
    assert layout.join is paths.join
    for name in (
        "CURSOR_PREFIX",
        "GARBAGE_PATH",
        "CLOCK_PATH",
        "OLDEST_PATH",
        "LOG_PREFIX",
        "MANIFEST_PATH",
    ):
        assert getattr(layout, name) is getattr(paths, name), name
    assert claim.CLAIM_PATH is paths.CLAIM_PATH
    assert manager.log_prefix is paths.log_prefix
    assert dirty.dirty_prefix is paths.dirty_prefix
    assert forks.current_key is paths.current_key
    assert forks.compacted_prefix is paths.compacted_prefix
    assert versions.current_key is paths.current_key
    assert versions.version_prefix is paths.version_prefix
    assert versions.data_key is paths.data_key
    assert versions.CURRENT_NAME is paths.CURRENT_NAME
    assert membership.LIVE_PREFIX is paths.COMPACTORS_LIVE_PREFIX
    assert membership.Liveness.key("m") == paths.live_key("m")
    assert scheduler.PROGRESS_PREFIX is paths.COMPACTORS_PROGRESS_PREFIX
    assert scheduler.ProgressLedger(None, "m").key == paths.progress_key("m")  # type: ignore[arg-type]


# --- No key spelled outside wal3/paths.py ------------------------------------------------------

# A string constant spelling a key, or a piece of one: it starts with a key directory (a regex's
# "^" allowed), names a directory inside another key, or holds a name only keys use.  "/logs/"
# and "/dirty/..." are the REST API's routes (they start with "/"), and bare words like "log",
# "gc" or "compacted" are CLI commands and statuses, so neither counts.
_KEY_LITERAL = re.compile(
    r"^\^?(logs|dirty|compacted|compactors|cursor|gc|log|snapshot|manifest)/"
    r"|(^|/)(compacted|compactors|cursor|gc|log|snapshot|manifest)/"
    r"|Bucket=|FragmentSeqNo=|SNAPSHOT\\?\.|CURRENT\.json|^part-|/part-"
    r"|^(CLAIM|TENANT|MANIFEST|GARBAGE|CLOCK|OLDEST)$"
)


def key_literals(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, value) of every string constant in ``source`` that spells a key; docstrings and
    other bare string statements, like comments, do not count."""
    tree = ast.parse(source, filename)
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    # Under mutation testing (verify/mutation.py) the module holds mutmut's variants of each
    # function besides the original (``..._mutmut_orig``); a variant that upper-cases
    # "snapshot.setsum" is the mutation, not a key spelled here.
    prose |= {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and re.search(r"__mutmut_\d+$", node.name)
        for inner in ast.walk(node)
    }
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in prose
        and _KEY_LITERAL.search(node.value)
    )


def test_no_key_is_spelled_outside_the_paths_module() -> None:
    files = [f for p in PACKAGES for f in sorted((ROOT / p).rglob("*.py")) if f != OWNER]
    assert len(files) > 20
    found = {
        f"{f.relative_to(ROOT)}:{line}": value
        for f in files
        for line, value in key_literals(f.read_text(), str(f))
    }
    assert not found, "spell these keys with wal3.paths"


def test_the_paths_module_is_where_they_are() -> None:
    assert len(key_literals(OWNER.read_text())) >= 10


def test_the_scan_sees_a_key_and_ignores_prose() -> None:
    source = '''
"""Module docstring: logs/{uuid}/manifest/MANIFEST."""
# a comment: gc/GARBAGE
A = "logs/"
B = f"dirty/{x}"
C = f"compacted/{cid}/CURRENT.json"
D = re.compile(r"^log/Bucket=([0-9a-f]{16})/FragmentSeqNo=([0-9a-f]{16})\\.parquet$")
E = re.compile(re.escape(P) + r"SNAPSHOT\\.[0-9a-f]{64}")
F = "CLAIM"
G = join(p, "TENANT")
H = ("cursor/", "snapshot/", "gc/")
I = f"{prefix}part-{token}.parquet"
J = "compactors/live/"


def f():
    """Returns cursor/{name}.json."""
    "a bare string: manifest/MANIFEST"
    return "/v1/tenants/t/logs/x", "/v1/dirty/rollup", "log", "gc", "compacted", "/gc"
'''
    got = key_literals(source)
    assert [line for line, _ in got] == [4, 5, 6, 6, 7, 8, 9, 10, 11, 11, 11, 12, 13]


def test_mutmut_variants_are_not_keys_but_the_original_still_is() -> None:
    """verify/mutation.py runs this test on a module holding mutmut's variants: a variant's
    upper-cased label is the mutation; the original function keeps being checked."""
    source = (
        "def x_f__mutmut_orig():\n    return 'snapshot/x'\n"
        "def x_f__mutmut_1():\n    return 'SNAPSHOT.SETSUM'\n"
    )
    assert key_literals(source) == [(2, "snapshot/x")]
