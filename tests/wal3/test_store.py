"""Object-store conformance (LocalStore and S3Store on moto over HTTP), plus each store's own
guarantees: LocalStore across processes and crashes, S3Store's retries and ambiguity handling."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from wal3.errors import ObjectNotFound, PreconditionFailed, StoreError, StoreUnavailable
from wal3.localstore import LocalStore
from wal3.s3store import S3Store
from wal3.store import GetResult, ObjectStore, content_etag, etag_matches_content
from wal3.storeurl import open_store, store_url_parts

from ..conftest import S3FaultProxy

# ============================================================================ conformance (both)


async def keys_of(store: ObjectStore, prefix: str, start_after: str | None = None) -> list[str]:
    """The keys a listing yields, in the order it yields them."""
    return [m.key async for m in store.list(prefix, start_after=start_after)]


async def test_put_get_head_roundtrip(store: ObjectStore) -> None:
    data = os.urandom(3 * 1024 * 1024 + 7)  # > 1 MiB: S3 clients switch to Expect: 100-continue
    etag = await store.put("dir/obj", data)
    assert etag_matches_content(etag, data)

    got = await store.get("dir/obj")
    assert got.data == data
    assert got.etag == etag

    meta = await store.head("dir/obj")
    assert (meta.key, meta.etag, meta.size) == ("dir/obj", etag, len(data))
    assert abs(meta.last_modified - time.time()) < 24 * 3600  # epoch seconds, not ms or a datetime


async def test_empty_object(store: ObjectStore) -> None:
    etag = await store.put("empty", b"", if_none_match="*")
    assert etag_matches_content(etag, b"")
    assert (await store.get("empty")).data == b""
    assert (await store.head("empty")).size == 0


async def test_missing_key_is_object_not_found(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        await store.get("nope")
    with pytest.raises(ObjectNotFound):
        await store.head("nope/deeper")


async def test_unconditional_put_overwrites(store: ObjectStore) -> None:
    await store.put("k", b"one")
    etag = await store.put("k", b"two")
    assert await store.get("k") == GetResult(data=b"two", etag=etag)


async def test_create_only_put_wins_once(store: ObjectStore) -> None:
    first = await store.put("k", b"first", if_none_match="*")
    with pytest.raises(PreconditionFailed):
        await store.put("k", b"second", if_none_match="*")
    got = await store.get("k")
    assert (got.data, got.etag) == (b"first", first)


async def test_if_match_replaces_only_at_current_etag(store: ObjectStore) -> None:
    v1 = await store.put("k", b"v1", if_none_match="*")
    v2 = await store.put("k", b"v2", if_match=v1)
    assert etag_matches_content(v2, b"v2")
    with pytest.raises(PreconditionFailed):
        await store.put("k", b"v3", if_match=v1)  # stale
    assert (await store.get("k")).data == b"v2"
    v4 = await store.put("k", b"v4", if_match=v2)
    assert (await store.get("k")).etag == v4


async def test_if_match_on_missing_key_is_precondition_failed(store: ObjectStore) -> None:
    with pytest.raises(PreconditionFailed):
        await store.put("missing", b"x", if_match=content_etag(b"whatever"))
    with pytest.raises(ObjectNotFound):
        await store.get("missing")


async def test_etags_from_every_read_work_as_if_match(store: ObjectStore) -> None:
    """get, head, put (and list, where it gives etags) all hand out etags usable as if_match."""
    etag = await store.put("k", b"0")
    etag = await store.put("k", b"1", if_match=etag)
    etag = await store.put("k", b"2", if_match=(await store.get("k")).etag)
    etag = await store.put("k", b"3", if_match=(await store.head("k")).etag)
    listed = [m async for m in store.list("k")]
    assert [m.key for m in listed] == ["k"]
    if listed[0].etag:  # LocalStore leaves list etags empty; S3 gives them
        assert listed[0].etag == etag
        etag = await store.put("k", b"4", if_match=listed[0].etag)
    # Quoted or bare, an etag names the same version.
    etag = await store.put("k", b"5", if_match=etag.strip('"'))
    await store.put("k", b"6", if_match='"' + etag.strip('"') + '"')
    assert (await store.get("k")).data == b"6"


async def test_put_rejects_bad_conditions(store: ObjectStore) -> None:
    with pytest.raises(ValueError):
        await store.put("k", b"x", if_none_match="*", if_match="abc")
    with pytest.raises(ValueError):
        await store.put("k", b"x", if_none_match="etag")  # type: ignore[arg-type]


async def test_delete_is_idempotent(store: ObjectStore) -> None:
    await store.put("k", b"x")
    await store.delete("k")
    with pytest.raises(ObjectNotFound):
        await store.get("k")
    await store.delete("k")
    await store.delete("never/existed")
    # The key is free again for a create-only put.
    await store.put("k", b"y", if_none_match="*")
    assert (await store.get("k")).data == b"y"


async def test_list_prefix_order_and_metadata(store: ObjectStore) -> None:
    keys = ["a/2", "a/10", "a/1", "a/b/c", "ab", "b/1", "a-"]
    for i, k in enumerate(keys):
        await store.put(k, b"x" * i)
    assert await keys_of(store, "a/") == ["a/1", "a/10", "a/2", "a/b/c"]
    assert await keys_of(store, "a") == ["a-", "a/1", "a/10", "a/2", "a/b/c", "ab"]
    assert await keys_of(store, "") == sorted(keys)
    assert await keys_of(store, "a/b/") == ["a/b/c"]
    assert await keys_of(store, "zzz/") == []
    sizes = {m.key: m.size async for m in store.list("")}
    assert sizes == {k: i for i, k in enumerate(keys)}
    async for m in store.list("b/"):
        assert abs(m.last_modified - time.time()) < 24 * 3600


async def test_list_start_after(store: ObjectStore) -> None:
    for i in range(6):
        await store.put(f"p/{i:02d}", b"x")
    await store.put("q/00", b"x")
    assert await keys_of(store, "p/", start_after="p/02") == ["p/03", "p/04", "p/05"]
    assert await keys_of(store, "p/", start_after="p/025") == ["p/03", "p/04", "p/05"]
    assert await keys_of(store, "p/", start_after="p/05") == []
    assert await keys_of(store, "p/", start_after="a") == [f"p/{i:02d}" for i in range(6)]


async def test_list_across_pages(store: ObjectStore) -> None:
    if isinstance(store, S3Store):
        store.list_page_size = 3  # several list_objects_v2 pages without creating 1000+ keys
    want = [f"pg/{i:03d}" for i in range(11)]
    await asyncio.gather(*(store.put(k, k.encode()) for k in want))
    assert await keys_of(store, "pg/") == want
    assert await keys_of(store, "pg/", start_after="pg/004") == want[5:]


async def test_copy(store: ObjectStore) -> None:
    src_etag = await store.put("src", b"payload")
    etag = await store.copy("src", "dst")
    assert etag_matches_content(etag, b"payload")
    assert (await store.get("dst")).data == b"payload"
    assert (await store.get("src")).etag == src_etag  # untouched

    await store.copy("src", "dst2", if_none_match="*")
    assert (await store.get("dst2")).data == b"payload"
    await store.put("src", b"changed")
    with pytest.raises(PreconditionFailed):
        await store.copy("src", "dst2", if_none_match="*")
    assert (await store.get("dst2")).data == b"payload"

    with pytest.raises(ObjectNotFound):
        await store.copy("no-such-src", "dst3")


async def test_concurrent_create_only_writers_one_winner(atomic_store: ObjectStore) -> None:
    store = atomic_store  # racing conditional writes: not on moto (see the fixture)
    for round_ in range(3):
        key = f"race/{round_}"
        payloads = [f"writer-{i}".encode() for i in range(24)]
        results = await asyncio.gather(
            *(store.put(key, p, if_none_match="*") for p in payloads), return_exceptions=True
        )
        winners = [i for i, r in enumerate(results) if isinstance(r, str)]
        assert len(winners) == 1, results
        assert all(isinstance(r, PreconditionFailed) for r in results if not isinstance(r, str))
        assert (await store.get(key)).data == payloads[winners[0]]


async def test_concurrent_if_match_writers_one_winner(atomic_store: ObjectStore) -> None:
    store = atomic_store  # racing conditional writes: not on moto (see the fixture)
    base = await store.put("cas", b"base")
    payloads = [f"writer-{i}".encode() for i in range(24)]
    results = await asyncio.gather(
        *(store.put("cas", p, if_match=base) for p in payloads), return_exceptions=True
    )
    winners = [i for i, r in enumerate(results) if isinstance(r, str)]
    assert len(winners) == 1, results
    assert (await store.get("cas")).data == payloads[winners[0]]


async def test_url_for(store: ObjectStore, tmp_path: Path) -> None:
    url = store.url_for("a/b")
    if isinstance(store, LocalStore):
        assert url == (tmp_path / "store" / "a" / "b").resolve().as_uri()
    else:
        assert isinstance(store, S3Store)
        assert url == f"s3://{store.bucket}/root/a/b"


# ================================================================================ LocalStore


def _race_worker(root: str, name: str, rounds: int, barrier: Any, results: Any) -> None:
    """Child process: race the other child on create-only and if_match puts, round by round."""

    async def main() -> tuple[list[int], list[int]]:
        store = LocalStore(root)
        created, replaced = [], []
        for r in range(rounds):
            barrier.wait(timeout=60)  # both processes hit the same key at the same moment
            try:
                await store.put(f"create/{r}", name.encode(), if_none_match="*")
                created.append(r)
            except PreconditionFailed:
                pass
            barrier.wait(timeout=60)
            try:
                await store.put(f"cas/{r}", name.encode(), if_match=content_etag(b"initial"))
                replaced.append(r)
            except PreconditionFailed:
                pass
        return created, replaced

    created, replaced = asyncio.run(main())
    results.put((name, created, replaced))


def test_local_two_processes_race_conditional_puts(tmp_path: Path) -> None:
    rounds = 40
    root = str(tmp_path / "store")
    setup = LocalStore(root)

    async def seed() -> None:
        for r in range(rounds):
            await setup.put(f"cas/{r}", b"initial")

    asyncio.run(seed())
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_race_worker, args=(root, n, rounds, barrier, results))
        for n in ("p0", "p1")
    ]
    for p in procs:
        p.start()
    outcome = {}
    for _ in procs:
        name, created, replaced = results.get(timeout=120)
        outcome[name] = (set(created), set(replaced))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0

    async def check() -> None:
        for r in range(rounds):
            create_winners = [n for n, (c, _) in outcome.items() if r in c]
            cas_winners = [n for n, (_, x) in outcome.items() if r in x]
            assert len(create_winners) == 1, (r, outcome)
            assert len(cas_winners) == 1, (r, outcome)
            assert (await setup.get(f"create/{r}")).data == create_winners[0].encode()
            assert (await setup.get(f"cas/{r}")).data == cas_winners[0].encode()

    asyncio.run(check())


_CRASH_EXIT = 17


def _crash_mid_write(root: str, key: str, size: int) -> None:
    """Child process: start writing a large object and die (os._exit) after three 1 MiB chunks."""
    real_write = os.write
    calls = 0

    def write(fd: int, data: Any) -> int:
        nonlocal calls
        if len(data) < 4096:  # not the object (interpreter plumbing): leave it alone
            return real_write(fd, data)
        calls += 1
        if calls > 3:
            os._exit(_CRASH_EXIT)  # no cleanup, no finally blocks: like a kill -9
        return real_write(fd, bytes(data[: 1 << 20]))

    os.write = write  # this is the child process: patching the os module only affects the child
    asyncio.run(LocalStore(root).put(key, b"n" * size))
    os._exit(0)  # reaching here means the crash was not simulated


@pytest.mark.parametrize("existing", [None, b"old version"])
async def test_local_crash_mid_write_never_shows_torn_object(
    tmp_path: Path, existing: bytes | None
) -> None:
    root = tmp_path / "store"
    store = LocalStore(root)
    if existing is not None:
        await store.put("big", existing)
    size = 8 << 20
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_crash_mid_write, args=(str(root), "big", size))
    proc.start()
    await asyncio.to_thread(proc.join, 120)
    assert proc.exitcode == _CRASH_EXIT

    # The torn bytes exist, but only as a temp file outside the key space.
    temps = list((root / ".wal3-local" / "tmp").iterdir())
    assert [t.stat().st_size for t in temps] == [3 << 20]

    reopened = LocalStore(root)
    if existing is None:
        with pytest.raises(ObjectNotFound):
            await reopened.get("big")
        assert await keys_of(reopened, "") == []
        await reopened.put("big", b"n" * size, if_none_match="*")  # the key is still free
    else:
        assert (await reopened.get("big")).data == existing
        assert await keys_of(reopened, "") == ["big"]
    assert (await reopened.head("big")).size in (size, len(existing or b""))


async def test_local_sweeps_only_stale_temp_files(tmp_path: Path) -> None:
    root = tmp_path / "store"
    LocalStore(root)
    tmp = root / ".wal3-local" / "tmp"
    stale, fresh = tmp / "stale", tmp / "fresh"
    stale.write_bytes(b"torn")
    fresh.write_bytes(b"maybe in flight")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    LocalStore(root)
    assert not stale.exists()
    assert fresh.exists()  # another process may still be writing it


@pytest.mark.parametrize(
    "key",
    [
        "..",
        "../x",
        "a/../b",
        "a/..",
        ".",
        "./a",
        "a/./b",
        "/abs",
        "a//b",
        "a/",
        "",
        "a\\b",
        ".wal3-local/tmp/x",
    ],
)
async def test_local_rejects_keys_outside_the_key_space(tmp_path: Path, key: str) -> None:
    store = LocalStore(tmp_path / "store")
    (tmp_path / "x").write_bytes(b"outside")
    with pytest.raises(ValueError):
        await store.put(key, b"x")
    with pytest.raises(ValueError):
        await store.get(key)
    with pytest.raises(ValueError):
        await store.delete(key)
    assert (tmp_path / "x").read_bytes() == b"outside"


async def test_local_key_with_dots_inside_a_name_is_fine(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    await store.put("a/..b/c..", b"ok")
    assert (await store.get("a/..b/c..")).data == b"ok"


async def test_local_hidden_dir_is_never_listed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    await store.put("k", b"x")
    await store.put("cas", b"x")
    await store.put("cas", b"y", if_match=content_etag(b"x"))  # creates a lock file
    hidden = tmp_path / "store" / ".wal3-local"
    assert any((hidden / "locks").iterdir())
    (hidden / "tmp" / "leftover").write_bytes(b"torn")
    assert await keys_of(store, "") == ["cas", "k"]
    assert await keys_of(store, ".") == []
    assert await keys_of(store, ".wal3-local/") == []
    assert await keys_of(store, ".wal3-local/tmp/") == []
    assert await keys_of(store, "../") == []


async def test_local_list_leaves_etag_empty(tmp_path: Path) -> None:
    """Documented LocalStore behaviour: list does not read files to hash them; use head."""
    store = LocalStore(tmp_path / "store")
    await store.put("k", b"x")
    assert [(m.key, m.etag, m.size) async for m in store.list("")] == [("k", "", 1)]


# =================================================================================== S3Store


@pytest.fixture
async def make_s3(moto_endpoint: str, s3_bucket: str) -> AsyncIterator[Callable[..., S3Store]]:
    """Build S3Stores on the test bucket (directly on moto, or through a proxy), closed after."""
    made: list[S3Store] = []

    def make(endpoint: str | None = None, prefix: str = "root", **kw: Any) -> S3Store:
        kw.setdefault("region", "us-east-1")
        # Backoff is product behaviour, not synchronisation: keep it tiny so tests stay fast.
        kw.setdefault("base_backoff_s", 0.001)
        kw.setdefault("max_backoff_s", 0.005)
        store = S3Store(s3_bucket, prefix, endpoint_url=endpoint or moto_endpoint, **kw)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


def raw_keys(moto_endpoint: str, bucket: str) -> list[str]:
    """Every key in the bucket, as moto stores it (no prefix handling)."""
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]


@pytest.fixture
async def make_seaweed_s3(
    seaweedfs: Any, seaweed_bucket: str
) -> AsyncIterator[Callable[..., S3Store]]:
    """Build S3Stores on a bucket of the SeaweedFS server (directly, or through a proxy).

    SeaweedFS, unlike moto, honours If-None-Match on CopyObject (and makes conditional writes
    atomic: the racing conformance tests use the ``atomic_store`` fixture); tests of those
    behaviours run against a real server, not a moto patch.
    """
    made: list[S3Store] = []

    def make(endpoint: str | None = None, prefix: str = "root", **kw: Any) -> S3Store:
        kw.setdefault("region", "us-east-1")
        kw.setdefault("base_backoff_s", 0.001)
        kw.setdefault("max_backoff_s", 0.005)
        store = S3Store(seaweed_bucket, prefix, endpoint_url=endpoint or seaweedfs.endpoint, **kw)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


async def test_s3_key_prefix_layout(
    make_s3: Callable[..., S3Store], moto_endpoint: str, s3_bucket: str
) -> None:
    nested = make_s3(prefix="/tenant/a/")
    bare = make_s3(prefix="")
    await nested.put("k", b"1")
    await bare.put("k", b"2")
    assert sorted(raw_keys(moto_endpoint, s3_bucket)) == ["k", "tenant/a/k"]
    assert nested.url_for("k") == f"s3://{s3_bucket}/tenant/a/k"
    assert bare.url_for("x/y") == f"s3://{s3_bucket}/x/y"
    assert await keys_of(nested, "") == ["k"]
    assert await keys_of(bare, "") == ["k", "tenant/a/k"]
    assert (await nested.get("k")).data == b"1"


async def test_s3_endpoint_from_environment(
    make_s3: Callable[..., S3Store],
    moto_endpoint: str,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    store = S3Store(s3_bucket, "env", region="us-east-1")
    try:
        assert store.endpoint_url == moto_endpoint
        await store.put("k", b"v")
        assert raw_keys(moto_endpoint, s3_bucket) == ["env/k"]
    finally:
        await store.close()


async def test_s3_close_is_idempotent_and_store_reconnects(make_s3: Callable[..., S3Store]) -> None:
    store = make_s3()
    await store.put("k", b"v")
    await store.close()
    await store.close()
    assert (await store.get("k")).data == b"v"


async def test_s3_missing_bucket_is_not_a_missing_object(
    make_s3: Callable[..., S3Store], moto_endpoint: str
) -> None:
    store = S3Store(
        f"absent-{uuid.uuid4().hex[:8]}", endpoint_url=moto_endpoint, region="us-east-1"
    )
    try:
        with pytest.raises(StoreError) as got:
            await store.get("k")
        assert not isinstance(got.value, ObjectNotFound)
        with pytest.raises(StoreError) as put_err:
            await store.put("k", b"v", if_match=content_etag(b"x"))
        assert not isinstance(put_err.value, PreconditionFailed)
    finally:
        await store.close()


async def test_s3_retries_throttling_and_5xx(
    make_s3: Callable[..., S3Store], s3_fault_proxy: S3FaultProxy
) -> None:
    store = make_s3(s3_fault_proxy.endpoint)
    s3_fault_proxy.fail_next("slowdown", method="PUT", count=2)
    s3_fault_proxy.fail_next("throttle", method="PUT")
    etag = await store.put("k", b"v")
    assert s3_fault_proxy.actions("PUT") == ["slowdown", "slowdown", "throttle", "forward"]

    s3_fault_proxy.fail_next("internal_error", method="GET", count=2)
    s3_fault_proxy.fail_next("forward_then_drop", method="GET")
    got = await store.get("k")
    assert (got.data, got.etag) == (b"v", etag)
    assert s3_fault_proxy.actions("GET") == [
        "internal_error",
        "internal_error",
        "forward_then_drop",
        "forward",
    ]

    s3_fault_proxy.fail_next("slowdown", method="HEAD")
    assert (await store.head("k")).etag == etag
    s3_fault_proxy.fail_next("internal_error", method="DELETE")
    await store.delete("k")
    assert s3_fault_proxy.actions("DELETE") == ["internal_error", "forward"]


async def test_s3_gives_up_with_store_unavailable(
    make_s3: Callable[..., S3Store], s3_fault_proxy: S3FaultProxy
) -> None:
    store = make_s3(s3_fault_proxy.endpoint, max_attempts=3)
    s3_fault_proxy.fail_next("slowdown", method="GET", count=3)
    with pytest.raises(StoreUnavailable):
        await store.get("k")
    assert s3_fault_proxy.actions("GET") == ["slowdown"] * 3
    s3_fault_proxy.fail_next("internal_error", method="PUT", count=3)
    with pytest.raises(StoreUnavailable):
        await store.put("k", b"v")
    assert s3_fault_proxy.actions("PUT") == ["internal_error"] * 3


async def test_s3_list_pages_through_the_store(
    make_s3: Callable[..., S3Store], s3_fault_proxy: S3FaultProxy
) -> None:
    store = make_s3(s3_fault_proxy.endpoint, list_page_size=3)
    want = [f"l/{i:02d}" for i in range(10)]
    for k in want:
        await store.put(k, b"x")
    s3_fault_proxy.fail_next("slowdown", method="GET")  # a throttled page is retried, not skipped
    assert await keys_of(store, "l/") == want
    assert s3_fault_proxy.actions("GET") == ["slowdown", "forward", "forward", "forward", "forward"]


@pytest.mark.parametrize("lost", ["forward_then_500", "forward_then_drop"])
async def test_s3_ambiguous_create_that_landed_is_success(
    make_s3: Callable[..., S3Store], s3_fault_proxy: S3FaultProxy, lost: str
) -> None:
    store = make_s3(s3_fault_proxy.endpoint)
    s3_fault_proxy.fail_next(lost, method="PUT")
    etag = await store.put("k", b"mine", if_none_match="*")
    assert etag_matches_content(etag, b"mine")
    # Settled by one read, never by re-sending the put (which would have failed its condition).
    assert s3_fault_proxy.actions("PUT") == [lost]
    assert s3_fault_proxy.actions("HEAD") == ["forward"]
    assert (await store.get("k")).data == b"mine"


@pytest.mark.parametrize("lost", ["forward_then_500", "forward_then_drop"])
async def test_s3_ambiguous_replace_that_landed_is_success(
    make_s3: Callable[..., S3Store], s3_fault_proxy: S3FaultProxy, lost: str
) -> None:
    store = make_s3(s3_fault_proxy.endpoint)
    v1 = await store.put("k", b"v1")
    s3_fault_proxy.fail_next(lost, method="PUT")
    v2 = await store.put("k", b"v2", if_match=v1)
    assert etag_matches_content(v2, b"v2")
    assert s3_fault_proxy.actions("PUT") == ["forward", lost]


async def test_s3_ambiguous_failure_that_did_not_land_is_retried(
    make_s3: Callable[..., S3Store], s3_fault_proxy: S3FaultProxy
) -> None:
    store = make_s3(s3_fault_proxy.endpoint)
    s3_fault_proxy.fail_next("internal_error", method="PUT")
    etag = await store.put("k", b"mine", if_none_match="*")
    assert (await store.get("k")).etag == etag
    assert s3_fault_proxy.actions("PUT") == ["internal_error", "forward"]
    assert s3_fault_proxy.actions("HEAD") == [
        "forward"
    ]  # the condition was checked before retrying


async def test_s3_ambiguous_failure_with_another_object_is_precondition_failed(
    make_s3: Callable[..., S3Store], s3_fault_proxy: S3FaultProxy
) -> None:
    store = make_s3(s3_fault_proxy.endpoint)
    await store.put("k", b"theirs")
    s3_fault_proxy.fail_next("internal_error", method="PUT")
    with pytest.raises(PreconditionFailed):
        await store.put("k", b"mine", if_none_match="*")
    assert s3_fault_proxy.actions("PUT") == ["forward", "internal_error"]  # no blind retry
    assert (await store.get("k")).data == b"theirs"


async def test_s3_throttled_conditional_put_is_resent_without_a_read(
    make_s3: Callable[..., S3Store], s3_fault_proxy: S3FaultProxy
) -> None:
    store = make_s3(s3_fault_proxy.endpoint)
    s3_fault_proxy.fail_next("slowdown", method="PUT", count=2)
    await store.put("k", b"mine", if_none_match="*")
    assert s3_fault_proxy.actions("PUT") == ["slowdown", "slowdown", "forward"]
    assert s3_fault_proxy.actions("HEAD") == []  # SlowDown means "not applied": nothing to settle


async def test_s3_ambiguous_put_with_unreadable_key_stays_unavailable(
    make_s3: Callable[..., S3Store], s3_fault_proxy: S3FaultProxy
) -> None:
    store = make_s3(s3_fault_proxy.endpoint, max_attempts=3)
    s3_fault_proxy.fail_next("forward_then_500", method="PUT")
    s3_fault_proxy.fail_next("internal_error", method="HEAD", count=3)
    with pytest.raises(StoreUnavailable):
        await store.put("k", b"mine", if_none_match="*")
    assert s3_fault_proxy.actions("PUT") == ["forward_then_500"]  # never guessed by re-sending


async def test_s3_server_side_conditional_copy(
    make_seaweed_s3: Callable[..., S3Store], seaweed_fault_proxy: S3FaultProxy
) -> None:
    """On a server that honours If-None-Match on CopyObject (SeaweedFS; moto ignores it)."""
    s3_fault_proxy = seaweed_fault_proxy
    store = make_seaweed_s3(s3_fault_proxy.endpoint, server_side_conditional_copy=True)
    src_etag = await store.put("src", b"payload")
    # Compared unquoted: SeaweedFS answers CopyObjectResult's ETag without the quotes AWS puts
    # round it, and S3Store.copy passes it through as is (put returns it quoted).
    assert (await store.copy("src", "dst", if_none_match="*")).strip('"') == src_etag.strip('"')
    await store.put("src", b"changed")
    with pytest.raises(PreconditionFailed):
        await store.copy("src", "dst", if_none_match="*")
    assert (await store.get("dst")).data == b"payload"
    # Server-side: the source's bytes never came through the client.
    assert not [p for m, p, _ in s3_fault_proxy.log if m == "GET" and p.endswith("/src")]
    with pytest.raises(ObjectNotFound):
        await store.copy("absent", "dst9", if_none_match="*")


async def test_s3_server_side_conditional_copy_settles_a_lost_answer(
    make_seaweed_s3: Callable[..., S3Store], seaweed_fault_proxy: S3FaultProxy
) -> None:
    s3_fault_proxy = seaweed_fault_proxy
    store = make_seaweed_s3(s3_fault_proxy.endpoint, server_side_conditional_copy=True)
    src_etag = await store.put("src", b"payload")
    s3_fault_proxy.fail_next("forward_then_drop", method="PUT")
    assert await store.copy("src", "dst", if_none_match="*") == src_etag
    assert s3_fault_proxy.actions("PUT") == ["forward", "forward_then_drop"]


async def test_s3_default_conditional_copy_goes_through_the_client(
    make_s3: Callable[..., S3Store], s3_fault_proxy: S3FaultProxy
) -> None:
    """Backends may ignore If-None-Match on CopyObject, so by default it is get + create-only put."""
    store = make_s3(s3_fault_proxy.endpoint)
    await store.put("src", b"payload")
    await store.copy("src", "dst", if_none_match="*")
    assert [p for m, p, _ in s3_fault_proxy.log if m == "GET" and p.endswith("/src")]
    await store.copy("src", "plain")  # unconditional copies stay server-side
    assert len([p for m, p, _ in s3_fault_proxy.log if m == "GET" and p.endswith("/src")]) == 1


def test_s3_constructor_validates() -> None:
    with pytest.raises(ValueError):
        S3Store("")
    with pytest.raises(ValueError):
        S3Store("bucket", max_attempts=0)
    with pytest.raises(ValueError):
        S3Store("bucket", list_page_size=1001)


# ================================================================================ open_store


def test_open_store_local_paths(tmp_path: Path) -> None:
    for url in (
        str(tmp_path / "a"),
        (tmp_path / "b").as_uri(),
        f"file://localhost{tmp_path / 'c'}",
    ):
        store = open_store(url)
        assert isinstance(store, LocalStore)
        assert store.root.parent == tmp_path.resolve()
    assert isinstance(open_store(str(tmp_path / "d"), fsync=False), LocalStore)


async def test_open_store_s3(
    moto_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    store = open_store(
        f"s3://{s3_bucket}/tenant/one/", endpoint_url=moto_endpoint, list_page_size=5
    )
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.region, store.list_page_size) == (
        s3_bucket,
        "tenant/one",
        "eu-west-3",
        5,
    )
    try:
        await store.put("k", b"v")
        assert raw_keys(moto_endpoint, s3_bucket) == ["tenant/one/k"]
        assert store.url_for("k") == f"s3://{s3_bucket}/tenant/one/k"
    finally:
        await store.close()

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    from_env = open_store("s3://bucket-name", region="us-east-2")
    assert isinstance(from_env, S3Store)
    assert (from_env.endpoint_url, from_env.region, from_env.prefix) == (
        "http://127.0.0.1:9",
        "us-east-2",
        "",
    )


@pytest.mark.parametrize(
    "url", ["gs://bucket/x", "http://host/x", "s3://", "file://otherhost/x", "s3:/bucket/x", ""]
)
def test_open_store_rejects_unsupported_urls(url: str) -> None:
    with pytest.raises(ValueError, match=r"store URL|s3 URL|file URL"):
        open_store(url)


def test_store_url_parts() -> None:
    parts = store_url_parts("s3://b/p/q/")
    assert (parts.scheme, parts.location, parts.prefix) == ("s3", "b", "p/q")
    parts = store_url_parts("file:///var/lib/wal3")
    assert (parts.scheme, parts.location, parts.prefix) == ("file", "/var/lib/wal3", "")
    assert store_url_parts("relative/dir").location == "relative/dir"
    with pytest.raises(ValueError, match="'gs'"):
        store_url_parts("gs://b")
