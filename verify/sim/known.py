"""Known bugs, recognised from a failing run's violations: the six of 3c61663, and two of the
adversarial GC review of b25d620 (7 and 8; tests/wal3/test_gc_adversary.py, findings 2 and 3).

Used to record which seed first finds each (docs/RELIABILITY.md); a signature is deliberately
narrow, so a seed is only credited with a bug whose symptom it shows exactly.
"""

from __future__ import annotations

import re

from wal3.paths import LOG_PREFIX, MANIFEST_PATH, join

from .actors import PREFIX
from .config import make_config
from .run import RunResult

_ONTO_EMPTY = re.compile(
    r"\((w[\d.]+): (.*)\) was answered LogContention .* \(linked by "
    r"(w[\d.]+) onto a root GC emptied\)"
)
_WRITER_CRASH = re.compile(r" w\d+\.\d+ CRASH ")
_FRAGMENT_PUT = f" put {join(PREFIX, LOG_PREFIX)}"  # the trace's line of a fragment upload
_MANIFEST_PUT = re.compile(r" (gcb?\.\d+) put " + re.escape(join(PREFIX, MANIFEST_PATH)) + " -> ok")

BUGS: dict[int, str] = {
    1: "an acknowledged append is written twice (hook fails, also during read repair)",
    2: "fencing fails once GC emptied the root: a LogContention append is linked",
    3: "GC wedges after splitting a snapshot at a cut inside its first fragment",
    4: "GC deletes data a cursor created while a plan was pending pins",
    5: "sealed logs are never collected through the writer's edit_manifest",
    6: "one transient upload failure fails the pipeline of a single writer as contention",
    7: "b25d620: a stalled collector cuts past a pin accepted after another discarded the plan",
    8: "b25d620: the orphan sweep deletes what a cut unlinked within the grace",
}


def classify(r: RunResult) -> set[int]:
    """Which known bugs the run's violations show."""
    cfg = make_config(r.seed)
    found: set[int] = set()
    for v in r.violations:
        d = v.detail
        if v.check == "once" and "append answered acked" in d:
            found.add(1)
        m = _ONTO_EMPTY.search(d)
        if (
            v.check == "contention"
            and m is not None
            and m.group(1) != m.group(3)
            and "another writer appended" in m.group(2)
        ):
            found.add(2)
        if v.check == "liveness" and "snapshot to delete is still referenced" in d:
            found.add(3)
        if v.check in ("cursor-delete", "cursor-reach"):
            found.add(4)
        if v.check == "liveness" and "LogSealed" in d and cfg.gc_via_writer:
            found.add(5)
        if (
            v.check == "contention"
            and "no other writer appended" in d
            and cfg.writers == 1
            and _only_uploads_failed(r)
        ):
            found.add(6)
        if v.check == "cursor-reach" and cfg.gc2 and _discarded_by_another(r):
            found.add(7)
        if v.check == "grace" and "after the manifest stopped referencing it" in d:
            found.add(8)
    return found


def _only_uploads_failed(r: RunResult) -> bool:
    """Before the first violation: a fragment upload met repeated 503s, and neither the hook
    failed nor a writer process crashed (their leftovers fail a pipeline by other paths)."""
    sticky = False
    for line in r.trace:
        if "VIOLATION" in line:
            break
        if _WRITER_CRASH.search(line) or " hook fails " in line:
            return False
        if _FRAGMENT_PUT in line and "503 sticky" in line:
            sticky = True
    return sticky


def _discarded_by_another(r: RunResult) -> bool:
    """Before the first violation a collector discarded a plan because of a cursor, and a
    different collector process then made a cut (the stalled one)."""
    discarder: str | None = None
    for line in r.trace:
        if "VIOLATION" in line:
            break
        m = re.search(r" (gcb?\.\d+) -> discarded .*a cursor now pins", line)
        if m:
            discarder = m.group(1)
        m = _MANIFEST_PUT.search(line)
        if discarder is not None and m and m.group(1) != discarder:
            return True
    return discarder is not None
