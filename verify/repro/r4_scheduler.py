"""R4: collections left to nobody by the scheduler's liveness/take-over.

Case 1 (`compactor run --once` from cron / COMPACTOR_ONCE): each run is a fresh process, so
(a) a configured member with no liveness record (it died before its first beat, or was never
deployed) always counts as alive (every run is 'young'), and (b) the take-over clock
(Scheduler._progress, in memory) starts from zero every run.  Its share is never compacted.

Case 2 (long-running): the stall clock restarts whenever a collection is missing from one poll
(e.g. its host's /v1/dirty poll failed once), so a flaky host keeps a stuck owner's collections
from ever being taken over.  Control: without the failed polls the take-over happens at 600 s.

Deterministic: LocalStore for liveness records, fake clocks, fake DirtySources."""
import asyncio, sys, tempfile
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import logging; logging.disable(logging.WARNING)
from host.wal3 import LocalStore
from compactor_client.membership import Liveness
from compactor_client.models import DirtyLog, DirtyResult
from compactor_client.scheduler import Scheduler, owner_of

class Clock:
    def __init__(self, t): self.t = t
    def __call__(self): return self.t

class Host:
    def __init__(self, url, logs): self.base_url, self.logs, self.fail = url, logs, False
    async def dirty(self, *, min_records=None, limit=None):
        if self.fail: raise RuntimeError(f"{self.base_url}: connect timeout")
        return DirtyResult(server_id=self.base_url, logs=self.logs)

def log(cid): return DirtyLog(tenant="t", collection_id=cid, start=1, limit=1001, num_records=1000)

def pick(owner, members):
    for i in range(1000):
        cid = f"00000000-0000-4000-8000-{i:012d}"
        if owner_of(cid, members) == owner: return cid

async def case1(store):
    print("case 1: --once runs every 10 min for 48 h; c2 is listed but died before its first beat")
    members = ["c1", "c2"]
    cid = pick("c2", members)
    host = Host("http://h1", [log(cid)])
    wall = Clock(1_800_000_000.0)
    taken = 0
    for run in range(288):
        wall.t += 600
        liveness = Liveness(store, "c1", ttl_s=60.0, clock=wall)       # as cli.run builds them
        sched = Scheduler([host], member_id="c1", members=members, min_records=1,
                          liveness=liveness, takeover_s=600.0, clock=wall)
        sel = await sched.select_round()
        taken += any(c.log.collection_id == cid for c in sel.selected)
    print(f"  rounds ranked over {sel.members}; runs that selected c2's collection: {taken}/288")
    print("  VIOLATION: a dirty collection left to nobody for 48 h (for ever)" if taken == 0 else "  held")

async def case2(store, flaky):
    members = ["c1", "c2"]
    cid = pick("c2", members)
    host = Host("http://h1", [log(cid)])
    wall = Clock(1_900_000_000.0)
    c2 = Liveness(store, "c2", ttl_s=240.0, clock=wall)    # c2 is alive (beats) but stuck
    c1 = Liveness(store, "c1", ttl_s=240.0, clock=wall)
    sched = Scheduler([host], member_id="c1", members=members, min_records=1, liveness=c1,
                      takeover_s=600.0, clock=wall)
    first = None
    for rnd in range(48 * 60):          # a round a minute for 48 h
        wall.t += 60
        await c2.beat()
        host.fail = flaky and rnd % 9 == 8   # one failed poll every 9 minutes
        sel = await sched.select_round()
        if any(c.log.collection_id == cid for c in sel.selected):
            first = rnd; break
    return first

async def main():
    store = LocalStore(Path(tempfile.mkdtemp(prefix="r4-", dir=None)) / "s")
    await case1(store)
    print("case 2: c2 alive but stuck on a collection, c1 should take it over after 600 s")
    r = await case2(LocalStore(Path(tempfile.mkdtemp(prefix="r4b-", dir=None)) / "s"), False)
    print("  control (every poll succeeds): taken over at round", r, "(minute", r + 1, ")")
    r = await case2(LocalStore(Path(tempfile.mkdtemp(prefix="r4c-", dir=None)) / "s"), True)
    print("  host poll fails once every 9 minutes: taken over at round", r)
    if r is None:
        print("  VIOLATION: never taken over in 48 h (the stall clock restarts at each failed poll)")

asyncio.run(main())
