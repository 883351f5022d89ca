"""Per-tenant quotas (issue 19): every quota answers 429 ``quota_exceeded`` naming it, with the
Retry-After its bucket gives (a fake clock, no sleeps); another tenant is unaffected; a request
that passed admission is never refused by a quota later; the configuration (inline JSON, the
file, re-read) and its errors; the per-tenant metrics' bounded cardinality; the per-tenant
long-poll cap.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from host.config import Settings
from host.errors import ANSWERS, HostKind, QuotaExceeded
from host.metrics import OTHER_TENANT, TenantMetrics
from host.quotas import Quota, TenantQuotas, TokenBucket, parse_quotas
from host.server import Server
from wal3 import LocalStore

from .live import Live, assert_error, live_server, log_path, record, wait_until


class FakeClock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def quotas_json(default: dict[str, Any] | None = None, **tenants: dict[str, Any]) -> str:
    return json.dumps({"default": default or {}, "tenants": tenants})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def append(c: httpx.AsyncClient, tenant: str, cid: Any, n: int, **rec: Any) -> httpx.Response:
    return await c.post(
        log_path(tenant, cid) + "/records",
        json={"records": [record(f"r{i}", **rec) for i in range(n)]},
    )


def quota_error(r: httpx.Response, tenant: str, quota: str, limit: str) -> dict[str, Any]:
    err = assert_error(r, 429, "quota_exceeded")
    assert err["message"] == f"tenant {tenant!r} quota {quota} ({limit}) exceeded"
    assert err["quota"] == quota
    return err


@pytest.fixture
async def live(
    tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[Live]:
    quotas, extra = request.param
    async with live_server(
        store=LocalStore(tmp_path / "store"), tenant_quotas=quotas, **extra
    ) as lv:
        lv.server.quotas.clock = clock
        yield lv


def params(quotas: str, **extra: Any) -> Any:
    return pytest.mark.parametrize("live", [(quotas, extra)], indirect=True)


# --------------------------------------------------------------------------- the error table


def test_quota_exceeded_has_its_row() -> None:
    answer = ANSWERS[HostKind.QUOTA_EXCEEDED]
    assert (answer.status, answer.code) == (429, "quota_exceeded")


# ------------------------------------------------------------------------ rates over HTTP


@params(quotas_json(alice={"records_per_s": 1, "records_burst": 5}))
async def test_records_per_s_retry_after_from_the_bucket_and_bob_unaffected(
    live: Live, clock: FakeClock
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    async with live.client("alice-key") as alice, live.client("bob-key") as bob:
        assert (await append(alice, "alice", a, 5)).status_code == 200  # the whole burst
        r = await append(alice, "alice", a, 3)
        quota_error(r, "alice", "records_per_s", "1/s")
        assert r.headers["Retry-After"] == "3"  # 3 tokens at 1/s
        # Bob has no quota: unaffected while alice is throttled.
        for _ in range(3):
            assert (await append(bob, "bob", b, 100)).status_code == 200
        clock.now += 1.0
        r = await append(alice, "alice", a, 3)
        quota_error(r, "alice", "records_per_s", "1/s")
        assert r.headers["Retry-After"] == "2"  # one token back, two to go
        clock.now += 2.0
        assert (await append(alice, "alice", a, 3)).status_code == 200
        # A refused request charged nothing: the bucket is empty only from the 3 just taken.
        clock.now += 3.0
        assert (await append(alice, "alice", a, 3)).status_code == 200
    text = (await _metrics(live)).splitlines()
    assert 'loghost_tenant_throttled_total{quota="records_per_s",tenant="alice"} 2.0' in text
    assert 'loghost_tenant_admitted_total{tenant="alice"} 3.0' in text
    assert 'loghost_tenant_admitted_total{tenant="bob"} 3.0' in text


@params(quotas_json(alice={"records_per_s": 1, "records_burst": 5}))
async def test_a_request_its_rate_refuses_is_refused_before_its_body_is_decoded(
    live: Live, clock: FakeClock
) -> None:
    """A refused flood costs the server no decoding (issue 19): the rate buckets judge a
    request on its counted records, before the body is validated, and exactly as admission
    does (the same quota named, the same Retry-After; nothing charged)."""
    decoder = live.server.records.decoder
    decoded: list[int] = []
    real = decoder.decode

    async def counting(raw: bytes) -> Any:
        decoded.append(len(raw))
        return await real(raw)

    decoder.decode = counting  # type: ignore[method-assign]
    a = uuid.uuid4()
    async with live.client("alice-key") as alice:
        assert (await append(alice, "alice", a, 4)).status_code == 200
        assert len(decoded) == 1
        r = await append(alice, "alice", a, 3)  # one token left: three records short of two
        quota_error(r, "alice", "records_per_s", "1/s")
        assert r.headers["Retry-After"] == "2"
        # A body the count cannot read is left to the decoder, which names what is wrong.
        bad = await alice.post(log_path("alice", a) + "/records", content=b"{")
        assert_error(bad, 400, "invalid_request")
        assert len(decoded) == 2, "the refused append was decoded"
        r = await append(alice, "alice", a, 6)  # more than the burst: refused until it is full
        quota_error(r, "alice", "records_per_s", "1/s")
        assert r.headers["Retry-After"] == "4"
        clock.now += 2.0
        # Nothing was charged by the refusals: the bucket holds its 1 + 2 tokens.
        assert (await append(alice, "alice", a, 3)).status_code == 200
        assert len(decoded) == 3


@params(quotas_json({"appends_per_s": 0.5, "appends_burst": 1}))
async def test_appends_per_s_default_applies_to_every_tenant_separately(
    live: Live, clock: FakeClock
) -> None:
    async with live.client("alice-key") as alice, live.client("bob-key") as bob:
        assert (await append(alice, "alice", uuid.uuid4(), 1)).status_code == 200
        r = await append(alice, "alice", uuid.uuid4(), 1)
        quota_error(r, "alice", "appends_per_s", "0.5/s")
        assert r.headers["Retry-After"] == "2"
        # Bob's bucket is his own.
        assert (await append(bob, "bob", uuid.uuid4(), 1)).status_code == 200
        clock.now += 2.0
        assert (await append(alice, "alice", uuid.uuid4(), 1)).status_code == 200


@params(quotas_json({"records_per_request": 3, "bytes_per_request": 400}))
async def test_per_request_limits(live: Live) -> None:
    cid = uuid.uuid4()
    async with live.client("alice-key") as alice:
        r = await append(alice, "alice", cid, 4)
        quota_error(r, "alice", "records_per_request", "3")
        assert "Retry-After" not in r.headers  # waiting does not help
        r = await append(alice, "alice", cid, 1, document="x" * 500)
        quota_error(r, "alice", "bytes_per_request", "400 bytes")
        assert "Retry-After" not in r.headers
        assert (await append(alice, "alice", cid, 3)).status_code == 200
        assert live.server.quotas.pending_bytes("alice") == 0


# ------------------------------------------------------------------------- the byte budget


@params(quotas_json(alice={"pending_bytes": 1000}))
async def test_pending_bytes_held_until_durable_or_failed(live: Live) -> None:
    mgr = live.server.manager
    cid, other = uuid.uuid4(), uuid.uuid4()
    async with live.client("alice-key") as alice, live.client("bob-key") as bob:
        # Bytes of another alice request, admitted and not yet durable.
        held = await mgr.admit("alice", other, records=1, nbytes=900, create=False)
        assert live.server.quotas.pending_bytes("alice") == 900
        r = await append(alice, "alice", cid, 1, document="y" * 200)
        quota_error(r, "alice", "pending_bytes", "1000 bytes")
        assert r.headers["Retry-After"] == "1"
        assert (await append(bob, "bob", other, 1, document="y" * 2000)).status_code == 200
        held.release()
        held.release()  # idempotent
        assert live.server.quotas.pending_bytes("alice") == 0
        assert (await append(alice, "alice", cid, 1, document="y" * 200)).status_code == 200
        assert live.server.quotas.pending_bytes("alice") == 0  # released once durable
        # A request that fails after admission gives its bytes back too.
        async with live.client() as svc:
            assert (await svc.post(log_path("alice", cid) + "/seal")).status_code == 200
        assert_error(await append(alice, "alice", cid, 1), 409, "sealed")
        assert live.server.quotas.pending_bytes("alice") == 0


# ------------------------------------------------------------------- open and created logs


@params(quotas_json(alice={"open_logs": 1}))
async def test_open_logs_evicts_only_the_tenants_own_idle_logs(live: Live) -> None:
    mgr = live.server.manager
    a1, a2, b1 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    async with live.client("alice-key") as alice, live.client("bob-key") as bob:
        assert (await append(bob, "bob", b1, 1)).status_code == 200
        assert (await append(alice, "alice", a1, 1)).status_code == 200
        # a1 is idle: a2 takes its place (alice's own log is closed, bob's stays open).
        assert (await append(alice, "alice", a2, 1)).status_code == 200
        open_ids = {h.collection_id for h in mgr.handles()}
        assert a2 in open_ids and a1 not in open_ids and b1 in open_ids
        assert mgr.tenant_open_logs("alice") == 1
        # a2 busy: no room for a1, and nothing of bob's is evicted for it.
        async with mgr.use(a2, "alice"):
            r = await append(alice, "alice", a1, 1)
            quota_error(r, "alice", "open_logs", "1")
            assert r.headers["Retry-After"] == "1"
            # A read that would open a1 is refused the same way.
            r = await alice.get(log_path("alice", a1) + "/records")
            quota_error(r, "alice", "open_logs", "1")
            assert b1 in {h.collection_id for h in mgr.handles()}
            assert (await append(bob, "bob", uuid.uuid4(), 1)).status_code == 200
        assert (await append(alice, "alice", a1, 1)).status_code == 200


@params(quotas_json(alice={"open_logs": 1}))
async def test_an_admitted_request_is_never_refused_by_a_quota_later(live: Live) -> None:
    """Admitted while alice's only open log was idle; that log is busy by the time the request
    opens its own: it opens anyway (over the quota) rather than fail after admission."""
    mgr = live.server.manager
    a1, a2 = uuid.uuid4(), uuid.uuid4()
    async with live.client("alice-key") as alice:
        assert (await append(alice, "alice", a1, 1)).status_code == 200
    admission = await mgr.admit("alice", a2, records=1, nbytes=10, create=True)
    try:
        async with mgr.use(a1, "alice"), mgr.use(a2, "alice", create=True) as h:
            assert h.collection_id == a2
            assert mgr.tenant_open_logs("alice") == 2
    finally:
        admission.release()
    # Not admitted: the same open is refused while a1 is busy.
    async with mgr.use(a1, "alice"):
        await mgr._close_handle(next(h for h in mgr.handles() if h.collection_id == a2))
        with pytest.raises(Exception) as e:
            async with mgr.use(a2, "alice"):
                pass
        assert getattr(e.value, "code", None) == "quota_exceeded"


@params(quotas_json(alice={"created_logs": 1}))
async def test_created_logs(live: Live) -> None:
    a1, a2 = uuid.uuid4(), uuid.uuid4()
    async with live.client("alice-key") as alice, live.client("bob-key") as bob:
        assert (await append(alice, "alice", a1, 1)).status_code == 200
        r = await append(alice, "alice", a2, 1)
        quota_error(r, "alice", "created_logs", "1")
        assert "Retry-After" not in r.headers
        assert (await append(alice, "alice", a1, 1)).status_code == 200  # an existing log
        assert (await append(bob, "bob", a2, 1)).status_code == 200  # bob's own quota
    # The refused log was not created (not bound to alice).
    assert await live.server.manager.binding(a2) == "bob"


# --------------------------------------------------------------------------- configuration


def test_overrides_key_by_key_and_null_lifts_a_default() -> None:
    cfg = parse_quotas(
        quotas_json(
            {"records_per_s": 100, "open_logs": 10},
            alice={"records_per_s": 500},
            batch={"records_per_s": None},
        )
    )
    assert cfg.quota("alice") == Quota(records_per_s=500, open_logs=10)
    assert cfg.quota("batch") == Quota(records_per_s=None, open_logs=10)
    assert cfg.quota("bob") == Quota(records_per_s=100, open_logs=10)
    assert not parse_quotas("").quota("x").limited()


@params(quotas_json({"records_per_request": 2}, alice={"records_per_request": 10}))
async def test_inline_json_overrides_over_http(live: Live) -> None:
    async with live.client("alice-key") as alice, live.client("bob-key") as bob:
        assert (await append(alice, "alice", uuid.uuid4(), 10)).status_code == 200
        quota_error(await append(bob, "bob", uuid.uuid4(), 3), "bob", "records_per_request", "2")


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a new inode: the change is seen whatever the mtime granularity


async def test_quotas_file_is_read_over_inline_and_re_read_when_it_changes(
    tmp_path: Path,
) -> None:
    f = tmp_path / "quotas.json"
    _write(f, quotas_json(alice={"records_per_request": 5}))
    async with (
        live_server(
            store=LocalStore(tmp_path / "store"),
            tenant_quotas=quotas_json({"records_per_request": 2}),
            tenant_quotas_file=str(f),
        ) as lv,
        lv.client("alice-key") as alice,
        lv.client("bob-key") as bob,
    ):
        assert (await append(alice, "alice", uuid.uuid4(), 5)).status_code == 200
        quota_error(
            await append(alice, "alice", uuid.uuid4(), 6), "alice", "records_per_request", "5"
        )
        quota_error(await append(bob, "bob", uuid.uuid4(), 3), "bob", "records_per_request", "2")
        _write(f, quotas_json(alice={"records_per_request": 1}, bob={"records_per_request": 3}))
        quota_error(
            await append(alice, "alice", uuid.uuid4(), 2), "alice", "records_per_request", "1"
        )
        assert (await append(bob, "bob", uuid.uuid4(), 3)).status_code == 200
        # A broken rewrite is refused; the quotas in use stay.
        _write(f, "{not json")
        quota_error(
            await append(alice, "alice", uuid.uuid4(), 2), "alice", "records_per_request", "1"
        )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "not JSON"),
        (quotas_json({"records_per_sec": 5}), "default.records_per_sec"),
        (quotas_json(alice={"open_logs": -1}), "tenants.alice.open_logs"),
        (quotas_json({"records_per_s": 0}), "default.records_per_s"),
        (json.dumps({"defaults": {}}), "defaults"),
    ],
)
def test_invalid_quota_config_is_a_clear_startup_error(
    tmp_path: Path, text: str, words: str
) -> None:
    settings = Settings(store=str(tmp_path / "s"), tenant_quotas=text, api_keys="k=*")
    with pytest.raises(ValueError, match="LOGHOST_TENANT_QUOTAS") as e:
        settings.parsed_tenant_quotas()
    assert words in str(e.value)
    with pytest.raises(ValueError, match="LOGHOST_TENANT_QUOTAS"):
        Server(settings, store=LocalStore(tmp_path / "s"))
    missing = Settings(store=str(tmp_path / "s"), tenant_quotas_file=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="LOGHOST_TENANT_QUOTAS_FILE"):
        missing.parsed_tenant_quotas()


def test_serve_refuses_invalid_quotas_with_one_line(tmp_path: Path) -> None:
    from .test_cli_errors import loghost, only_line

    out = loghost(
        "serve",
        "--store",
        str(tmp_path / "s"),
        LOGHOST_API_KEYS="k=*",
        LOGHOST_TENANT_QUOTAS=quotas_json({"records_per_sec": 5}),
    )
    assert out.returncode == 2
    line = only_line(out)
    assert line.startswith("loghost: error: invalid configuration: LOGHOST_TENANT_QUOTAS: ")
    assert "default.records_per_sec" in line
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------------- buckets and clock


def test_token_bucket_wait_and_debt() -> None:
    b = TokenBucket(rate=10, burst=20, now=0.0)
    assert b.wait_s(20, 0.0) == 0
    b.take(20, 0.0)
    assert b.wait_s(5, 0.0) == pytest.approx(0.5)
    assert b.wait_s(5, 0.5) == 0
    # More than the burst needs a full bucket, then goes into debt.
    assert b.wait_s(50, 0.5) == pytest.approx(1.5)
    assert b.wait_s(50, 2.0) == 0
    b.take(50, 2.0)
    assert b.wait_s(1, 2.0) == pytest.approx(3.1)


def test_a_refused_charge_takes_nothing_from_either_bucket() -> None:
    clock = FakeClock()
    q = TenantQuotas(
        parse_quotas(
            quotas_json(
                {"appends_per_s": 1, "appends_burst": 2, "records_per_s": 1, "records_burst": 5}
            )
        ),
        clock=clock,
    )
    quota = q.quota("t")
    q.charge("t", quota, appends=1, records=5)
    with pytest.raises(Exception, match="records_per_s"):
        q.charge("t", quota, appends=1, records=1)
    q.charge("t", quota, appends=1, records=0)  # the refused try took no append token
    with pytest.raises(Exception, match="appends_per_s"):
        q.charge("t", quota, appends=1, records=0)


def test_refused_requests_get_turns_spread_at_the_rate() -> None:
    """A tenant refused on many connections at once is held until turns 1/rate apart (up to the
    1 s horizon), not all for the same second: a common hold brought the whole flood back at
    once, and the admitted wave stalled every other tenant behind it (issue 19)."""
    clock = FakeClock()
    q = TenantQuotas(
        parse_quotas(quotas_json({"appends_per_s": 10, "appends_burst": 1})), clock=clock
    )
    quota = q.quota("a")
    q.charge("a", quota, appends=1, records=0)  # the burst
    holds = []
    for _ in range(14):  # 14 connections refused in the same instant
        with pytest.raises(QuotaExceeded) as e:
            q.charge("a", quota, appends=1, records=0)
        assert e.value.retry_after_s == 1  # the header: whole seconds, as HTTP has them
        holds.append(e.value.hold_s)
    assert holds[:10] == pytest.approx([0.1 * (i + 1) for i in range(10)])
    assert holds[10:] == [1.0] * 4  # beyond the horizon: held the longest, then they ask again
    # Another tenant's turns are its own.
    q.charge("b", q.quota("b"), appends=1, records=0)
    with pytest.raises(QuotaExceeded) as e:
        q.charge("b", q.quota("b"), appends=1, records=0)
    assert e.value.hold_s == pytest.approx(0.1)
    # Each held request finds its token at its turn.
    clock.now += 0.1
    q.charge("a", quota, appends=1, records=0)


@pytest.mark.parametrize("value", ["Infinity", "NaN", "1e400"])
def test_a_quota_of_infinity_or_nan_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="records_per_s"):
        parse_quotas('{"default": {"records_per_s": ' + value + "}}")


def test_the_retry_after_of_a_vanishing_rate_is_at_most_a_day() -> None:
    """Any positive rate is accepted; one so small that its wait overflows still answers (the
    header's ceil of an infinite wait raised)."""
    clock = FakeClock()
    q = TenantQuotas(parse_quotas(quotas_json({"appends_per_s": 1e-320})), clock=clock)
    quota = q.quota("t")
    q.charge("t", quota, appends=1, records=0)
    with pytest.raises(QuotaExceeded) as e:
        q.charge("t", quota, appends=1, records=0)
    assert e.value.retry_after_s == 86_400 and e.value.hold_s == 1.0


# ---------------------------------------------------------------------------------- metrics


def _tenant_labels(registry: CollectorRegistry) -> set[str]:
    return {
        s.labels["tenant"]
        for m in registry.collect()
        if m.name.startswith("loghost_tenant_")
        for s in m.samples
    }


def test_metric_cardinality_is_capped_at_top_n_plus_other() -> None:
    registry = CollectorRegistry()
    tm = TenantMetrics(top_n=3)
    registry.register(tm)
    for i in range(50):
        for _ in range(i + 1):
            tm.admitted(f"t{i}")
        tm.throttled(f"t{i}", "records_per_s")
        tm.in_flight(f"t{i}", 1, 10)
    assert _tenant_labels(registry) == {"t49", "t48", "t47", OTHER_TENANT}
    total = registry.get_sample_value("loghost_tenant_admitted_total", {"tenant": OTHER_TENANT})
    assert total == sum(i + 1 for i in range(47))
    throttled_other = registry.get_sample_value(
        "loghost_tenant_throttled_total", {"tenant": OTHER_TENANT, "quota": "records_per_s"}
    )
    assert throttled_other == 47
    assert registry.get_sample_value("loghost_tenant_in_flight", {"tenant": OTHER_TENANT}) == 47
    # A newcomer overtakes t47: t47's totals go to other (which only grows).
    for _ in range(1000):
        tm.admitted("big")
    assert _tenant_labels(registry) == {"big", "t49", "t48", OTHER_TENANT}
    after = registry.get_sample_value("loghost_tenant_admitted_total", {"tenant": OTHER_TENANT})
    assert after is not None and total is not None and after > total


@params(quotas_json(), tenant_metrics_top_n=1)
async def test_server_metrics_use_the_top_n_setting(live: Live) -> None:
    async with live.client("alice-key") as alice, live.client("bob-key") as bob:
        for _ in range(3):
            assert (await append(alice, "alice", uuid.uuid4(), 1)).status_code == 200
        assert (await append(bob, "bob", uuid.uuid4(), 1)).status_code == 200
    text = await _metrics(live)
    assert 'loghost_tenant_admitted_total{tenant="alice"} 3.0' in text
    assert 'loghost_tenant_admitted_total{tenant="other"} 1.0' in text
    assert 'tenant="bob"' not in text


async def _metrics(live: Live) -> str:
    """The per-tenant series: only to the service key, never on the public /metrics."""
    async with httpx.AsyncClient(base_url=live.url) as c:
        assert "loghost_tenant_" not in (await c.get("/metrics")).text
        assert (await c.get("/metrics/tenants")).status_code == 401
    async with live.client() as c:
        r = await c.get("/metrics/tenants")
        assert r.status_code == 200
        return r.text


# ------------------------------------------------------------------------ long-poll cap


@params(quotas_json(), max_long_polls_per_tenant=1)
async def test_long_polls_are_capped_per_tenant(live: Live) -> None:
    mgr = live.server.manager
    a, b = uuid.uuid4(), uuid.uuid4()
    async with live.client("alice-key") as alice, live.client("bob-key") as bob:
        assert (await append(alice, "alice", a, 1)).status_code == 200
        assert (await append(bob, "bob", b, 1)).status_code == 200
        poll = {"from": 2, "wait_ms": 30_000}
        first = asyncio.create_task(alice.get(log_path("alice", a) + "/records", params=poll))
        await wait_until(lambda: mgr.long_polls("alice", "tenant") == 1, "alice's long-poll")
        r = await alice.get(log_path("alice", a) + "/records", params=poll)
        err = assert_error(r, 429, "backpressure")
        assert err["reason"] == "long_poll" and "Retry-After" in r.headers
        # Bob's share is his own.
        bobs = asyncio.create_task(bob.get(log_path("bob", b) + "/records", params=poll))
        await wait_until(lambda: mgr.long_polls("bob", "tenant") == 1, "bob's long-poll")
        assert (await append(alice, "alice", a, 1)).status_code == 200
        assert (await append(bob, "bob", b, 1)).status_code == 200
        for task in (first, bobs):
            got = await task
            assert got.status_code == 200 and got.json()["records"], got.text
        await wait_until(lambda: mgr.long_polls("alice", "tenant") == 0, "alice's poll done")
        # A slot freed: alice may wait again.
        again = await alice.get(log_path("alice", a) + "/records", params={"from": 2, "wait_ms": 1})
        assert again.status_code == 200
    text = await _metrics(live)
    assert 'loghost_tenant_throttled_total{quota="long_polls",tenant="alice"} 1.0' in text


def test_a_floods_refusals_are_logged_a_line_per_interval_with_their_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A flood refused tens of times a second is one log line per tenant and quota every
    ``THROTTLE_LOG_EVERY_S`` (the metrics count each refusal), naming how many it stands for."""
    from host.quotas import THROTTLE_LOG_EVERY_S

    clock = FakeClock()
    config = parse_quotas(quotas_json({"appends_per_s": 0.001, "appends_burst": 1}))
    q = TenantQuotas(config, clock=clock)
    quota = q.quota("alice")
    caplog.set_level("INFO", logger="loghost.quotas")

    def refuse(tenant: str) -> None:
        with pytest.raises(QuotaExceeded):
            q.charge(tenant, quota, appends=1, records=1)

    q.charge("alice", quota, appends=1, records=1)
    q.charge("bob", quota, appends=1, records=1)
    for _ in range(5):
        refuse("alice")
    refuse("bob")  # a tenant of its own: its own line
    assert [r.getMessage() for r in caplog.records] == [
        "tenant alice over quota appends_per_s (0.001/s)",
        "tenant bob over quota appends_per_s (0.001/s)",
    ]
    clock.now += THROTTLE_LOG_EVERY_S - 0.001
    refuse("alice")  # still inside the interval
    assert len(caplog.records) == 2
    clock.now += 0.001
    refuse("alice")
    assert len(caplog.records) == 3
    assert caplog.records[-1].getMessage() == (
        "tenant alice over quota appends_per_s (0.001/s); 5 more refused since the last line"
    )
    assert caplog.records[-1].refused_since == 5  # type: ignore[attr-defined]
    registry = CollectorRegistry()
    registry.register(q.metrics)
    throttled = registry.get_sample_value(
        "loghost_tenant_throttled_total", {"quota": "appends_per_s", "tenant": "alice"}
    )
    assert throttled == 7, "the metrics count every refusal"
