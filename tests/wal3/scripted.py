"""A scripted object store and a scripted second writer, for adversarial interleavings of the
writer's recovery (tests/wal3/test_repair_adversary*.py).

``ScriptedStore`` runs ``script(op, key, kwargs)`` before each request: the script may wait on
events or act as another writer on the inner store, and says what becomes of the request (pass,
fail, or land and lose its answer), so every interleaving is forced, never timed.
``OtherWriter`` is that other writer: plain conditional puts, as any writer of the format makes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from wal3 import ObjectNotFound, ObjectStore, PreconditionFailed, StoreUnavailable
from wal3.fragment import EncodedFragment, decode_fragment, encode_fragment
from wal3.layout import load_manifest
from wal3.manifest import FragmentPointer
from wal3.paths import MANIFEST_PATH, fragment_path, join
from wal3.setsum import Setsum
from wal3.store import GetResult, ObjectMeta, content_etag
from wal3.writer import FragmentInfo

from .helpers import assert_dense, read_all, recomputed_setsum

# A verdict for one request: None (pass through), "fail" (StoreUnavailable, nothing done) or
# "lose" (done, then StoreUnavailable: the answer was lost).
Verdict = Literal["fail", "lose"] | None
Script = Callable[[str, str, dict[str, Any]], Awaitable[Verdict]]


class ScriptedStore(ObjectStore):
    """Delegates to ``inner``; before each request ``script(op, key, kwargs)`` runs and says
    what becomes of it (``kwargs`` of a put: its conditions and data)."""

    def __init__(self, inner: ObjectStore, script: Script) -> None:
        self.inner, self.script = inner, script

    async def _run(
        self, op: str, key: str, kw: dict[str, Any], call: Callable[[], Awaitable[Any]]
    ) -> Any:
        verdict = await self.script(op, key, kw)
        if verdict == "fail":
            raise StoreUnavailable(f"scripted {op} failure of {key}")
        r = await call()
        if verdict == "lose":
            raise StoreUnavailable(f"scripted lost answer of {op} {key}")
        return r

    async def get(self, key: str) -> GetResult:
        return await self._run("get", key, {}, lambda: self.inner.get(key))  # type: ignore[no-any-return]

    async def head(self, key: str) -> ObjectMeta:
        return await self._run("head", key, {}, lambda: self.inner.head(key))  # type: ignore[no-any-return]

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        kw = {"if_none_match": if_none_match, "if_match": if_match, "data": data}
        return await self._run(  # type: ignore[no-any-return]
            "put",
            key,
            kw,
            lambda: self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match),
        )

    async def delete(self, key: str) -> None:
        await self._run("delete", key, {}, lambda: self.inner.delete(key))

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        async for m in self.inner.list(prefix, start_after=start_after):
            yield m

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)


class OtherWriter:
    """Another writer of the log at ``prefix`` (or a dead one's leftovers), acting directly on
    the store it is given."""

    def __init__(self, store: ObjectStore, prefix: str, name: str = "other") -> None:
        self.store, self.prefix, self.name = store, prefix, name
        self.n = 0
        self.links = 0
        self.uploads = 0

    async def _put_frag(
        self, seq: int, off: int, prev: Setsum | None, body: bytes | None = None
    ) -> EncodedFragment:
        """Upload its fragment at ``seq``; a dead object there (one that does not follow the
        tail it follows) is overwritten with If-Match on its etag, as a writer does."""
        self.n += 1
        frag = encode_fragment(
            seq,
            off,
            1_000 + self.n,
            [body or f"{self.name}{self.n}".encode()],
            prev=prev,
            writer=self.name,
        )
        key = join(self.prefix, frag.path)
        try:
            await self.store.put(key, frag.data, if_none_match="*")
        except PreconditionFailed:
            got = await self.store.get(key)
            d = decode_fragment(got.data)
            if d.start == off and d.prev == prev:
                raise  # a live fragment in its slot: it lost the race
            await self.store.put(key, frag.data, if_match=got.etag)
        self.uploads += 1
        return frag

    async def upload_next(self, body: bytes | None = None) -> int:
        """Upload a fragment following the stored tail, unlinked (in flight); its seq."""
        m, _ = await load_manifest(self.store, self.prefix)  # type: ignore[misc]
        await self._put_frag(m.next_seq_no, m.next_offset, m.tail_setsum, body)
        return m.next_seq_no

    async def top_up(self, depth: int) -> None:
        """Keep ``depth`` fragments of a pipeline in flight past the stored tail (its own
        unlinked uploads there are kept, the missing ones uploaded, each following the last)."""
        m, _ = await load_manifest(self.store, self.prefix)  # type: ignore[misc]
        seq, off, prev = m.next_seq_no, m.next_offset, m.tail_setsum
        for _ in range(depth):
            key = join(self.prefix, fragment_path(seq))
            try:
                d = decode_fragment((await self.store.get(key)).data)
            except ObjectNotFound:
                frag = await self._put_frag(seq, off, prev)
                seq, off, prev = seq + 1, frag.limit, frag.setsum
                continue
            seq, off, prev = seq + 1, d.limit, d.setsum

    async def link_tail_orphan(self) -> int:
        """Link whatever fragment sits at the stored tail's next slot (its own, or anyone's: a
        read repair); its seq."""
        m, etag = await load_manifest(self.store, self.prefix)  # type: ignore[misc]
        seq = m.next_seq_no
        got = await self.store.get(join(self.prefix, fragment_path(seq)))
        d = decode_fragment(got.data)
        ptr = FragmentPointer(
            fragment_path(seq),
            seq,
            d.start,
            d.limit,
            len(got.data),
            d.setsum,
            content_etag(got.data),
        )
        await self.store.put(
            join(self.prefix, MANIFEST_PATH),
            m.with_fragments([ptr], self.name).to_bytes(),
            if_match=etag,
        )
        self.links += 1
        return seq

    async def append(self, body: bytes | None = None) -> int:
        """Upload a fragment after the stored tail and link it; its seq."""
        seq = await self.upload_next(body)
        await self.link_tail_orphan()
        return seq

    async def upload_chain(self, n: int) -> list[int]:
        """Upload ``n`` fragments, each following the one before (a pipelining writer that then
        crashed: none linked); their seqs."""
        m, _ = await load_manifest(self.store, self.prefix)  # type: ignore[misc]
        seq, off, prev = m.next_seq_no, m.next_offset, m.tail_setsum
        seqs = []
        for _ in range(n):
            frag = await self._put_frag(seq, off, prev)
            seqs.append(seq)
            seq, off, prev = seq + 1, frag.limit, frag.setsum
        return seqs

    async def seal(self) -> None:
        m, etag = await load_manifest(self.store, self.prefix)  # type: ignore[misc]
        await self.store.put(
            join(self.prefix, MANIFEST_PATH), m.with_sealed(self.name).to_bytes(), if_match=etag
        )


def stays_ahead(other: OtherWriter, rounds: dict[str, int]) -> Script:
    """A script: before each of our manifest puts (If-Match), while ``rounds["left"]``, the other
    writer links its in-flight fragment and uploads its next one, so it is always one fragment
    ahead (a live writer); ``rounds["used"]`` counts the times it did."""
    manifest_key = join(other.prefix, MANIFEST_PATH)

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and key == manifest_key and kw["if_match"] and rounds["left"] > 0:
            rounds["left"] -= 1
            rounds["used"] += 1
            await other.link_tail_orphan()
            await other.upload_next()
        return None

    return script


class Hooked:
    """A fragment hook that records every call (seq, repaired)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    async def __call__(self, info: FragmentInfo) -> None:
        self.calls.append((info.seq_no, info.repaired))

    def seqs(self) -> set[int]:
        return {s for s, _ in self.calls}


async def verified_bodies(store: ObjectStore, prefix: str) -> list[bytes]:
    """The log's records, verified dense and against the manifest's setsum."""
    manifest, records = await read_all(store, prefix)
    assert_dense(records, manifest.oldest_offset)
    assert manifest.setsum == await recomputed_setsum(store, prefix, manifest)
    return [r.body for r in records]
