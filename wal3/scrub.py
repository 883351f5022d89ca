"""Scrub: prove a log intact end to end from the objects alone.

Every snapshot and fragment the manifest reaches is read back; each fragment's setsum is
recomputed from its records and compared with its pointer, ranges and sequence numbers are checked
for contiguity across the whole tree, sizes against the objects, and finally the sum of everything
live plus ``collected`` against the manifest's ``setsum``.  Each problem is reported precisely.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from .errors import CorruptFragment, CorruptManifest, ObjectNotFound
from .fragment import decode_fragment
from .layout import load_manifest
from .manifest import FragmentPointer, Manifest, Pointer, Snapshot
from .paths import MANIFEST_PATH, join, parse_fragment_path
from .setsum import Setsum
from .store import ObjectStore, content_etag


@dataclass
class ScrubReport:
    """What scrub checked and every problem it found."""

    prefix: str
    problems: list[str] = field(default_factory=list)
    fragments: int = 0
    snapshots: int = 0
    records: int = 0
    bytes: int = 0
    setsum: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the log is intact."""
        return not self.problems


async def scrub_log(
    store: ObjectStore,
    prefix: str,
    *,
    concurrency: int = 8,
    progress: Callable[[int], None] | None = None,
) -> ScrubReport:
    """Scrub one log; ``progress`` is called with the bytes of each fragment verified."""
    prefix = prefix.strip("/")
    report = ScrubReport(prefix=prefix)
    try:
        loaded = await load_manifest(store, prefix)
    except CorruptManifest as e:
        report.problems.append(f"{MANIFEST_PATH}: {e}")
        return report
    if loaded is None:
        report.problems.append(f"{MANIFEST_PATH}: missing")
        return report
    manifest: Manifest = loaded[0]

    leaves: list[FragmentPointer] = []

    async def walk(pointers: tuple[Pointer, ...], where: str) -> None:
        for p in pointers:
            if isinstance(p, FragmentPointer):
                leaves.append(p)
                continue
            try:
                got = await store.get(join(prefix, p.path_to_snapshot))
                snap = Snapshot.from_bytes(got.data)
            except ObjectNotFound:
                report.problems.append(f"{p.path_to_snapshot} (in {where}): snapshot missing")
                continue
            except CorruptManifest as e:
                report.problems.append(f"{p.path_to_snapshot} (in {where}): {e}")
                continue
            report.snapshots += 1
            pointer = snap.to_pointer()
            if snap.depth < p.depth:  # Rust's wrapped lone child (see SnapshotCache.get)
                pointer = replace(pointer, depth=p.depth)
            if pointer != p:
                report.problems.append(
                    f"{p.path_to_snapshot} (in {where}): pointer says setsum={p.setsum} "
                    f"depth={p.depth} [{p.start},{p.limit}) {p.num_bytes}B but the snapshot holds "
                    f"setsum={pointer.setsum} depth={pointer.depth} "
                    f"[{pointer.start},{pointer.limit}) {pointer.num_bytes}B"
                )
            await walk(snap.children, p.path_to_snapshot)

    await walk(manifest.entries, MANIFEST_PATH)

    # Contiguity and numbering across the whole tree, not just within each node.
    prev: FragmentPointer | None = None
    for f in leaves:
        if parse_fragment_path(f.path) != f.seq_no:
            report.problems.append(f"{f.path}: path does not name seq_no {f.seq_no}")
        if prev is not None:
            if f.start != prev.limit:
                report.problems.append(
                    f"{f.path}: starts at {f.start} but the previous fragment ends at {prev.limit}"
                )
            if f.seq_no != prev.seq_no + 1:
                report.problems.append(f"{f.path}: seq_no {f.seq_no} follows {prev.seq_no}")
        prev = f
    if leaves and leaves[0].start != manifest.oldest_offset:
        report.problems.append(
            f"first fragment starts at {leaves[0].start}, manifest says {manifest.oldest_offset}"
        )

    sem = asyncio.Semaphore(concurrency)
    computed: list[Setsum] = []

    async def check(f: FragmentPointer) -> None:
        async with sem:
            try:
                got = await store.get(join(prefix, f.path))
            except ObjectNotFound:
                report.problems.append(f"{f.path}: fragment missing")
                return
            try:
                frag = await asyncio.to_thread(decode_fragment, got.data)
            except CorruptFragment as e:
                report.problems.append(f"{f.path}: {e}")
                return
        computed.append(frag.setsum)
        report.fragments += 1
        report.records += len(frag.records)
        report.bytes += len(got.data)
        if frag.setsum != f.setsum:
            report.problems.append(
                f"{f.path}: setsum of the records is {frag.setsum}, manifest says {f.setsum}"
            )
        if (frag.start, frag.limit) != (f.start, f.limit):
            report.problems.append(
                f"{f.path}: holds [{frag.start},{frag.limit}), manifest says [{f.start},{f.limit})"
            )
        if f.content_md5 is not None and content_etag(got.data) != f.content_md5:
            report.problems.append(
                f"{f.path}: object bytes do not match the recorded MD5 {f.content_md5}"
            )
        if len(got.data) != f.num_bytes:
            report.problems.append(
                f"{f.path}: object is {len(got.data)} bytes, manifest says {f.num_bytes}"
            )
        if progress is not None:
            progress(len(got.data))

    await asyncio.gather(*(check(f) for f in leaves))
    total = manifest.collected
    for s in computed:
        total = total + s
    report.setsum = total.hexdigest()
    if not report.problems and total != manifest.setsum:
        report.problems.append(
            f"{MANIFEST_PATH}: fragments + collected = {total}, manifest setsum = {manifest.setsum}"
        )
    return report


async def find_logs(store: ObjectStore, prefix: str = "") -> AsyncIterator[str]:
    """Every log (a prefix holding ``manifest/MANIFEST``) under ``prefix``."""
    suffix = "/" + MANIFEST_PATH
    async for meta in store.list(prefix.strip("/")):
        if meta.key.endswith(suffix):
            yield meta.key[: -len(suffix)]
        elif meta.key == MANIFEST_PATH:
            yield ""
