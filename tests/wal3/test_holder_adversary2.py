"""Adversarial review of a8ff7b1 (and 53ad3c8): what is still open around ``lease_holder``.

Time is a manual clock; interleavings are forced with a scripted store
(``tests/wal3/scripted.py``), never timed.

1. **A log created by two writers of one name: both "created" it, both lease it.**
   ``LogWriter.open`` creates a missing log with ``put_resolving`` (If-None-Match) of
   ``Manifest.empty(writer_name)`` plus ``read_lease_ms``, and the created manifest is the one
   write of a writer that is *not* stamped (``Lease.stamped``): it records no ``lease_holder``.
   Its bytes name nothing but the writer's name and lease.  Two writers opening a new log at
   once under the same name and lease (the default name is ``host:pid``: two containers on
   host networking are ``host:1`` both) build byte-identical manifests.  When the second
   one's create is answered 503 (nothing landed: the first one's was there already),
   ``put_resolving`` reads the key back, finds "exactly our bytes" (the content etag of the
   other's identical manifest) and returns success: both writers ``landed(None, ...)`` the
   same etag, both are its author (``authored``), neither fences.  The first appends r1 and
   acknowledges it at once (its base is its own); the second's lease, issued before, still
   vouches for the empty manifest: a read through it misses r1, acknowledged before the read
   began.  (With a 0-lease host nothing is leased; with a stamped holder token in the created
   manifest the bytes would differ and the read-back would say "another object exists".)
   Severity: safety (read leases), but it needs two live writers of one log with the same
   name and lease, which the lease docstring rules out ("writer names must be unique per
   process"); the default name does not guarantee it across containers.  Predates 53ad3c8;
   the per-writer token that 53ad3c8 introduced closes it now that the create is stamped
   (``LogWriter.open``): the test failed on a8ff7b1 and passes since.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wal3 import LocalStore, LogWriter
from wal3.paths import MANIFEST_PATH, join

from .scripted import ScriptedStore, Verdict
from .test_read_lease import ManualClock, _opts

PREFIX = "logs/held2"
MKEY = join(PREFIX, MANIFEST_PATH)


async def test_a_create_resolved_by_identical_bytes_leases_someone_elses_log(
    tmp_path: Path,
) -> None:
    inner = LocalStore(tmp_path / "store")
    clock = ManualClock()
    name = "host:1"  # default_writer_name() of a PID-1 process in a host-networked container
    first: dict[str, Any] = {}

    async def open_first() -> None:
        first["w"] = await LogWriter.open(inner, PREFIX, _opts(clock, name, lease_s=2.0))

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if key == MKEY and op == "put" and kw["if_none_match"] == "*" and "w" not in first:
            # The second writer loaded no log; before its create lands, the first one creates
            # it (same name, same lease: the same bytes).  The second's put is answered 503
            # and did not land (the key is taken).
            await open_first()
            return "fail"
        return None

    second = await LogWriter.open(
        ScriptedStore(inner, script), PREFIX, _opts(clock, name, lease_s=2.0)
    )
    one = first["w"]
    # Only the first wrote the stored manifest: the second's create, read back, found another
    # writer's bytes (its holder token differs), so it loaded the log and fences for it.
    assert one.authored and not second.authored
    assert second.fencing
    r1 = await one.append(b"r1")  # acknowledged: its base is its own creation, no fence
    seen = second.current_manifest()  # a read asked after r1's acknowledgement
    assert seen is None or seen.next_offset > r1.offset, (
        f"r1 (offset {r1.offset}) acknowledged by the first writer, but the second's lease "
        f"answers up to offset {seen.next_offset}, without it"
    )
    for w in (one, second):
        await w.close()
