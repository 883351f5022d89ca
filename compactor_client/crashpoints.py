"""Named points where a test can have the compactor killed with SIGKILL, as ``kill -9`` would.

``COMPACTOR_CRASH_AT=<point>`` in the environment of a compactor started as the leader of a new
session (``start_new_session``) kills it — the driver, its JVM and the Python workers — the first
time execution reaches ``<point>``.  Unset (always, outside tests), a point is
one dictionary lookup.  The crash tests (tests/compactor_client/test_crash.py) kill at every
point and check that the store is consistent and that the next round completes:

* ``fold:merged``   an executor wrote a run produced by a merge (others may be unwritten);
* ``fold:written``  an executor wrote every new run of a collection;
* ``install:before`` the driver is about to put ``CURRENT.json``;
* ``install:after`` ``CURRENT.json`` is installed, the compaction cursor not yet advanced;
* ``cursor:after``  the cursor advanced, nothing pruned yet;
* ``prune:mid``     the first file of a prune was deleted.
"""

from __future__ import annotations

import contextlib
import os
import signal

VARIABLE = "COMPACTOR_CRASH_AT"
POINTS = (
    "fold:merged",
    "fold:written",
    "install:before",
    "install:after",
    "cursor:after",
    "prune:mid",
)


def crash_point(name: str) -> None:
    """SIGKILL the compactor if ``COMPACTOR_CRASH_AT`` names ``name`` (tests only: the test sets
    the variable only for a compactor it started as the leader of a new session).

    The whole session's leading group goes — the driver and its JVM — and this process's own
    group, which differs on a Spark executor (PySpark's worker daemon makes a group of its own).
    """
    if os.environ.get(VARIABLE) == name:
        # This process's own group last: killing it ends this process, and the loop with it.
        for group in dict.fromkeys((os.getsid(0), os.getpgrp())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
