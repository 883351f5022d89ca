"""Scheduling: merge/dedupe, rendezvous assignment, budget, polling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from compactor_client.models import DirtyLog, DirtyResult
from compactor_client.scheduler import (
    Candidate,
    Scheduler,
    apply_budget,
    assigned_to,
    merge_candidates,
    owner_of,
    poll_hosts,
    rendezvous_weight,
    select,
)


def cand(
    cid: str,
    *,
    host: str = "http://h1",
    start: int = 1,
    limit: int = 10,
    num: int = 9,
    score: float = 1.0,
    tenant: str = "t",
) -> Candidate:
    return Candidate(
        host,
        DirtyLog(
            tenant=tenant, collection_id=cid, start=start, limit=limit, num_records=num, score=score
        ),
    )


COLLECTIONS = [f"coll-{i:04d}" for i in range(2000)]


def test_rendezvous_is_stable_and_order_independent() -> None:
    members = ["m1", "m2", "m3"]
    first = {c: owner_of(c, members) for c in COLLECTIONS[:200]}
    assert first == {c: owner_of(c, list(reversed(members))) for c in COLLECTIONS[:200]}
    assert rendezvous_weight("m1", "coll-0000") != rendezvous_weight("m2", "coll-0000")
    # Length-prefixing: ("ab","c") and ("a","bc") must not collide.
    assert rendezvous_weight("ab", "c") != rendezvous_weight("a", "bc")


# Known answers: every compactor, in every process, on every host, must compute these weights,
# or two members disagree on who owns a collection.  Pinned values also catch a changed digest.
KNOWN_WEIGHTS = {
    ("m1", "coll-0000"): 17591216903825516648,
    ("m2", "coll-0000"): 3874998307867809223,
    ("compactor-0", "6d1f7a52-3c3e-4a5c-9d1e-0f2b7c9a1e01"): 8443416677978782954,
}


def test_rendezvous_weights_are_known_answers() -> None:
    assert {k: rendezvous_weight(*k) for k in KNOWN_WEIGHTS} == KNOWN_WEIGHTS


def test_rendezvous_weights_agree_across_processes() -> None:
    """A per-process salt (e.g. Python's ``hash()`` of a str, randomised by PYTHONHASHSEED) would
    make each compactor compute different owners; comparing in one process cannot see it."""
    root = Path(__file__).resolve().parents[2]
    pairs = [["m1", "coll-0000"], ["m2", "coll-0000"], ["m3", "coll-0042"], ["ab", "c"]]
    code = (
        "import json, sys\n"
        "from compactor_client.scheduler import rendezvous_weight, owner_of\n"
        "pairs = json.loads(sys.argv[1])\n"
        "print(json.dumps({'w': [rendezvous_weight(m, c) for m, c in pairs],\n"
        "                  'o': [owner_of(f'coll-{i:04d}', ['m1', 'm2', 'm3']) for i in range(50)]}))\n"
    )
    mine = {
        "w": [rendezvous_weight(m, c) for m, c in pairs],
        "o": [owner_of(f"coll-{i:04d}", ["m1", "m2", "m3"]) for i in range(50)],
    }
    for seed in ("0", "1", "12345"):  # distinct string-hash seeds, distinct processes
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(pairs)],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert json.loads(out.stdout) == mine, f"PYTHONHASHSEED={seed}"


def test_rendezvous_is_balanced() -> None:
    members = ["m1", "m2", "m3", "m4"]
    counts = Counter(owner_of(c, members) for c in COLLECTIONS)
    assert set(counts) == set(members)
    expected = len(COLLECTIONS) / len(members)
    for m in members:
        assert abs(counts[m] - expected) < 0.15 * expected, counts


def test_adding_a_member_moves_about_one_nth_and_only_to_it() -> None:
    before = {c: owner_of(c, ["m1", "m2", "m3", "m4"]) for c in COLLECTIONS}
    after = {c: owner_of(c, ["m1", "m2", "m3", "m4", "m5"]) for c in COLLECTIONS}
    moved = [c for c in COLLECTIONS if before[c] != after[c]]
    assert all(after[c] == "m5" for c in moved)
    assert 0.15 < len(moved) / len(COLLECTIONS) < 0.25


def test_each_collection_goes_to_exactly_one_member() -> None:
    members = ["a", "b", "c"]
    cands = [cand(c) for c in COLLECTIONS[:300]]
    shares = [assigned_to(cands, m, members) for m in members]
    keys = [c.key for share in shares for c in share]
    assert len(keys) == len(set(keys)) == 300


def test_single_member_takes_everything() -> None:
    cands = [cand(c) for c in COLLECTIONS[:50]]
    assert assigned_to(cands, "solo", ["solo"]) == cands
    assert assigned_to(cands, "solo", []) == cands


def test_merge_lowest_start_wins() -> None:
    merged = merge_candidates(
        [
            cand("x", host="http://h1", start=5, limit=20),
            cand("x", host="http://h2", start=3, limit=10),
            cand("y", host="http://h2", start=1),
            cand("x", host="http://h3", start=7, limit=30),
            cand("y", host="http://h1", start=1, limit=99),
            cand("x", tenant="other", host="http://h3", start=9),
        ]
    )
    by_key = {c.key: c for c in merged}
    assert len(merged) == 3
    assert by_key[("t", "x")].host_url == "http://h2" and by_key[("t", "x")].log.start == 3
    # Equal starts: the larger limit wins, deterministically.
    assert by_key[("t", "y")].log.limit == 99
    assert by_key[("other", "x")].log.start == 9


def test_budget_takes_highest_scores_that_fit() -> None:
    cands = [
        cand("low", score=1, num=10),
        cand("top", score=9, num=60),
        cand("mid", score=5, num=50),
        cand("small", score=3, num=30),
    ]
    chosen = [c.log.collection_id for c in apply_budget(cands, 100)]
    # top (60) fits, mid (50) would overrun, small (30) fits, low (10) fits.
    assert chosen == ["top", "small", "low"]


def test_budget_always_takes_the_top_collection() -> None:
    chosen = apply_budget([cand("huge", num=10_000, score=2), cand("tiny", num=1, score=1)], 100)
    assert [c.log.collection_id for c in chosen] == ["huge"]


def test_select_combines_merge_assignment_min_records_and_budget() -> None:
    members = ["m1", "m2"]
    cands = [cand(c, num=5 + i % 10, score=float(i)) for i, c in enumerate(COLLECTIONS[:100])]
    cands += [cand(c.log.collection_id, host="http://h2", start=0) for c in cands[:10]]
    sel = select(cands, member_id="m1", members=members, budget_records=10**9, min_records=8)
    mine = {c.log.collection_id for c in sel.selected}
    assert all(owner_of(c, members) == "m1" for c in mine)
    assert all(c.log.num_records >= 8 for c in sel.selected)
    assert sel.merged == 100
    scores = [c.log.score for c in sel.selected]
    assert scores == sorted(scores, reverse=True)


class FakeHost:
    def __init__(self, url: str, logs: list[DirtyLog] | None, error: Exception | None = None):
        self.base_url = url
        self.logs = logs or []
        self.error = error
        self.calls: list[tuple[int | None, int | None]] = []

    async def dirty(
        self, *, min_records: int | None = None, limit: int | None = None, retry: bool = True
    ) -> DirtyResult:
        self.calls.append((min_records, limit))
        if self.error:
            raise self.error
        return DirtyResult(server_id=self.base_url, logs=self.logs)


async def test_poll_survives_a_failing_host() -> None:
    ok = FakeHost("http://ok", [cand("a").log, cand("b").log])
    bad = FakeHost("http://bad", None, ConnectionError("down"))
    polled = await poll_hosts([ok, bad], min_records=3, limit=7)
    assert [c.log.collection_id for c in polled.candidates] == ["a", "b"]
    assert all(c.host_url == "http://ok" for c in polled.candidates)
    assert set(polled.failed_hosts) == {"http://bad"}
    assert ok.calls == [(3, 7)]


async def test_scheduler_round_dedupes_across_hosts() -> None:
    h1 = FakeHost("http://h1", [cand("a", start=4).log, cand("b").log])
    h2 = FakeHost("http://h2", [cand("a", start=2).log])
    sel = await Scheduler([h1, h2], member_id="solo").select_round()
    picked = {c.log.collection_id: c for c in sel.selected}
    assert set(picked) == {"a", "b"}
    assert picked["a"].host_url == "http://h2"


def test_scheduler_rejects_member_outside_membership() -> None:
    with pytest.raises(ValueError):
        Scheduler([], member_id="x", members=["a", "b"])


async def test_a_dead_host_is_polled_once_without_backoff() -> None:
    """A host that refuses connections (gone, still in COMPACTOR_HOSTS) fails the poll at once:
    the round does not wait out the client's retries, which the next round would repeat."""
    import socket

    from compactor_client.client import LogHostClient

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async with LogHostClient(dead, "k", sleep=sleep) as client:
        polled = await poll_hosts([client])
        assert list(polled.failed_hosts) == [dead] and not polled.candidates
        assert waits == []
        with pytest.raises(Exception, match="cannot connect"):
            await client.dirty()  # a caller's own listing still retries
        assert len(waits) == client.max_retries
