"""The one settings object: every option of the log host, from flags or ``LOGHOST_*`` variables."""

from __future__ import annotations

import difflib
import logging
import os
import re
import socket
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .auth import merge_keys, parse_keys, read_keys_file
from .quotas import QuotaConfig, load_quota_config

_log = logging.getLogger("loghost.config")

ENV_PREFIX = "LOGHOST_"


# A server id names the host's dirty log and liveness record, and is adopted by name: one rule.
SERVER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def _default_server_id() -> str:
    return socket.gethostname()


class Settings(BaseSettings):
    """Configuration of one log host (``LOGHOST_<FIELD>`` in the environment)."""

    # No setting means anything at infinity or NaN: LOGHOST_CLAIM_TTL_S=inf (or 1e400) made a
    # claim that was never renewed, which every other host judged by its own TTL.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, allow_inf_nan=False
    )

    # Every field's description is its row of README.md's settings table (``python -m
    # host.settings_doc --write``); ``shown_default`` is the default the table shows when the
    # value itself says nothing (a computed one).
    store: str = Field(
        "./data/loghost",
        description="a path, `file:///dir`, or `s3://bucket/prefix` (endpoint from "
        "`AWS_ENDPOINT_URL`)",
    )
    listen: str = Field("127.0.0.1:8080", description="bind address")
    server_id: str = Field(
        default_factory=_default_server_id,
        description="stable id; names this server's dirty log `dirty/{id}/`",
        json_schema_extra={"shown_default": "hostname"},
    )
    advertise_url: str | None = Field(
        None,
        description="where other servers redirect clients",
        json_schema_extra={"shown_default": "from listen"},
    )
    redis_url: str | None = Field(None, description="advisory leader hint")
    api_keys: Annotated[str, NoDecode] = Field(
        "",
        description="`key=tenant,key=tenant:read,key=*,...` (see [Keys and roles]"
        "(#keys-and-roles)).  This or the file is required unless `--dev`",
        json_schema_extra={"shown_default": "—"},
    )
    # A file in the LOGHOST_API_KEYS format (a mounted Secret), re-read when it changes.
    api_keys_file: str | None = Field(
        None, description="a file of keys in the same format, re-read on change and on SIGHUP"
    )
    dev: bool = Field(
        False,
        description="a local trial: without keys, `serve` creates a service key and prints it "
        "(`--dev`)",
    )

    # Log manager: how many logs stay open, and how much they may buffer.
    max_open_logs: int = Field(1024, ge=1, description="open-log cap (LRU eviction of idle logs)")
    idle_close_s: float = Field(60.0, gt=0, description="close logs idle this long")
    max_log_outstanding_bytes: int = Field(
        16 << 20, ge=1024, description="bytes one log may have accepted but not yet made durable"
    )
    max_buffered_bytes: int = Field(
        256 << 20,
        ge=1024,
        description="server-wide bytes accepted but not yet durable; appends past it answer 429",
    )
    max_request_bytes: int = Field(8 << 20, ge=1024, description="larger bodies get 413")
    max_records_per_request: int = Field(
        10_000,
        ge=1,
        description="records in one append at most (10,000 at most whatever the setting); more "
        "answer 400",
    )
    # One record's metadata keys and embedding length at most: checked on the parsed JSON before
    # any validation, so no single validation call holds the GIL for an unbounded record.
    max_metadata_keys: int = Field(
        1024,
        ge=1,
        description="keys in one record's `metadata` at most; more answer 400 "
        "`record_too_large`, counted on the parsed JSON before the record is validated",
    )
    max_embedding_dims: int = Field(
        65536,
        ge=1,
        description="elements in one record's `embedding` at most; more answer 400 "
        "`record_too_large` (checked the same way)",
    )
    max_read_records: int = Field(
        10_000, ge=1, description="the largest `limit` a read may ask for; more answer 400"
    )
    max_wait_ms: int = Field(
        30_000,
        ge=0,
        description="the longest long-poll (`wait_ms`) a read may ask for; more answer 400",
    )
    batch_interval_ms: float = Field(
        2.0, ge=0, description="how long a writer batches appends before it writes a fragment"
    )
    shutdown_grace_s: float = Field(
        30.0,
        ge=0,
        description="drain time on SIGTERM (requests in flight finish) before logs are flushed; "
        "idle logs' hints go at once.  The chart's `host.config.shutdownGraceS` is the same value",
    )
    # Longer than clients' idle-connection expiry (httpx: 5 s, load balancers: 60 s), so a client
    # never sends on a connection the server is closing at that moment (a lost request).
    keep_alive_s: float = Field(
        75.0,
        gt=0,
        description="idle HTTP keep-alive; keep it above clients' and load balancers' idle "
        "timeouts",
    )
    # httptools parses a request in a fraction of h11's time; h11 is kept as a fallback with the
    # same guards (host.httpserver).
    http_parser: Literal["httptools", "h11"] = Field(
        "httptools",
        description="the HTTP/1.1 parser: `httptools` (fast) or `h11` (pure Python); both get "
        "the same timeouts and connection caps (with httptools, a connection with more than 16 "
        "pipelined requests queued is closed; h11 reads one request at a time)",
    )
    # Slow or silent clients: a request's headers, and its body, must arrive within these, and
    # at most this many connections are open (more are closed at once).
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a request's headers must arrive within this, or the connection is closed",
    )
    body_timeout_s: float = Field(60.0, gt=0, description="the same for its body")
    # An answer the client does not take within this (from when its socket stops taking bytes)
    # closes the connection: a reader that never reads cannot pin its answer for ever.
    send_timeout_s: float = Field(
        60.0,
        gt=0,
        description="an answer must be taken by the client within this, counted from when its "
        "socket stops taking bytes, or the connection is closed (large reads are streamed a "
        "group of fragments at a time, so a client that does not read holds about 1 MiB, not "
        "its whole answer)",
    )
    max_connections: int = Field(
        4096,
        ge=1,
        description="open connections at most; beyond it the oldest connection that has not "
        "shown a valid key yet is closed (idle ones first), and a newcomer is refused only when "
        "all others have",
    )
    # Connections none of whose requests carried a valid key yet (probes, scrapers, strangers):
    # beyond this the oldest of them is closed; they never push out authenticated connections.
    max_unauthenticated_connections: int = Field(
        512,
        ge=1,
        description="connections none of whose requests carried a valid key yet (probes, "
        "scrapers, strangers) at most; beyond it the oldest of them is closed, so they can never "
        "shut tenants out",
    )
    # Long-polls (wait_ms) waiting at once per tenant; more answer 429.
    max_long_polls_per_tenant: int = Field(
        256,
        ge=1,
        description="long-polls waiting at once per tenant and key role: the tenant's read-only "
        "keys together, its tenant keys, and service keys each get this many (so a reader "
        "cannot starve the application); more get 429",
    )

    # Tenant quotas (host.quotas): what one tenant may use of this host; unset: unlimited.
    # Checked when a server is built (not here: a chart value renders as any string).
    tenant_quotas: str = Field(
        "",
        description='per-tenant quotas as JSON, `{"default": {...}, "tenants": '
        '{"alice": {...}}}` (see [Tenant quotas](#tenant-quotas)); past one, 429 '
        "`quota_exceeded`",
        json_schema_extra={"shown_default": "unlimited"},
    )
    tenant_quotas_file: str | None = Field(
        None,
        description="a file of quotas in the same JSON, its entries over `LOGHOST_TENANT_QUOTAS`"
        ", re-read when it changes",
    )
    tenant_metrics_top_n: int = Field(
        20,
        ge=1,
        description="tenants (the most active) with their own `tenant` label in the per-tenant "
        "metrics; the others are summed as `other`",
    )
    # Fair share (host.fairshare): past the threshold of max_buffered_bytes, admission is shared
    # across the active tenants (by their quota `weight`) instead of first come, first served.
    fair_share: Literal["weighted", "fifo"] = Field(
        "weighted",
        description="`weighted`: share `LOGHOST_MAX_BUFFERED_BYTES` fairly across the active tenants "
        "(by their quota `weight`) when it is near full, and `LOGHOST_MAX_OPEN_LOGS` when it is "
        "full (see [Tenant quotas](#tenant-quotas)); `fifo`: first come, first served",
    )
    fair_share_threshold: float = Field(
        0.8,
        gt=0,
        description="fraction of `LOGHOST_MAX_BUFFERED_BYTES` in use past which appends wait "
        "for their tenant's fair share; below it they are admitted at once (1 or more: only "
        "when full)",
    )
    fair_share_max_wait_s: float = Field(
        5.0,
        gt=0,
        description="longest an append waits for its tenant's fair share; then 429 "
        "`backpressure`, reason `fair_share`",
    )

    # Garbage collection (always on, rate limited) and snapshots.
    gc_grace_s: float = Field(
        300.0,
        ge=0,
        description="delay between unlinking garbage and deleting it; above 2.5 x "
        "`LOGHOST_READ_LEASE_MAX_MS`.  0 deletes at once (tests: a reader or a recovery still "
        "on an older manifest may then fail)",
    )
    # A creation claim's TTL is a safety margin for a dead host's writes still in flight
    # (wal3/claim.py): derived from the bound on one store operation unless set.
    claim_ttl_s: float = Field(
        0.0,
        ge=0,
        description="how long the creation claim of a host that died must stand unchanged "
        "before another attempt may create that log (until then it answers 409 `contention`); "
        "0: 2 × max(60 s, `LOGHOST_GC_GRACE_S`); else at least 1 s.  Lower it only where every "
        "store request takes effect within half of it",
    )
    gc_interval_s: float = Field(60.0, gt=0, description="retry period of the always-on collector")
    gc_deletes_per_second: float = Field(
        200.0, gt=0, description="object deletes per second of the collector, per host"
    )
    # One collection pass drops at most this share of a log's live bytes (the verifier's alarm).
    gc_max_fraction: float = Field(
        0.9,
        gt=0,
        le=1,
        description="one collection pass drops at most this share of a log's live bytes (at "
        "least its oldest pointer); a plan over it is refused as a verifier alarm",
    )
    snapshot_fragment_threshold: int = Field(
        100,
        ge=2,
        description="fragments in a root manifest before older ones move to a snapshot",
    )
    snapshot_threshold: int = Field(20, ge=2, description="entries per snapshot")

    # Dirty log and compaction backpressure.
    rollup_interval_s: float = Field(10.0, gt=0, description="dirty-log roll-up period")
    dirty_max_age_s: float = Field(
        300.0,
        gt=0,
        description="a dirty entry older than this goes to the compactors even below their "
        "minimum record count",
    )
    dirty_max_reinserts: int = Field(
        10,
        ge=0,
        description="a dirty entry re-inserted by roll-ups more than this many times goes to "
        "the compactors even below their minimum record count",
    )
    backpressure_uncompacted_records: int = Field(
        1_000_000, ge=1, description="429 (reason `compaction`) above this backlog"
    )

    # Host membership (host.membership): liveness records in the store route logs without
    # Redis and adopt departed hosts' dirty logs.
    routing: Literal["membership", "none"] = Field(
        "membership",
        description="without Redis: `membership` serves each log on its rendezvous owner among "
        "the live hosts (others redirect); `none` serves every log on every host (two hosts "
        "writing one log are safe but contend: 409)",
    )
    membership_interval_s: float = Field(
        3.0, gt=0, description="seconds between rewrites of this host's liveness record"
    )
    membership_ttl_s: float = Field(
        10.0,
        gt=0,
        description="a serving host whose liveness record is younger than this is routed to",
    )
    adopt_after_s: float = Field(
        300.0,
        gt=0,
        description="a host silent this long has its dirty log adopted by one live host",
    )

    # Leader hint.
    leader_ttl_ms: int = Field(10_000, ge=100, description="lifetime of a Redis leader hint")
    # Reads answer from a writer's memory for this long after the store last proved its manifest
    # current; a host taking a log over holds acknowledgements 1.25 x this (no stale read, ever,
    # whatever Redis does).  0: every read loads the manifest from the store.
    read_lease_ms: int = Field(
        1000,
        ge=0,
        description="reads answer from a writer's memory while the store proved its manifest "
        "current less than this ago (else they load it); every manifest a host writes records "
        "this value, and a host taking a log over first claims it (one manifest write that links "
        "nothing) and links and acknowledges nothing for 1.25 x the value recorded in the "
        "manifest it takes over (the previous holder's lease, whatever its own setting), so no "
        "read misses an acknowledged record or a record another read returned, whatever Redis "
        "does, also while hosts' settings differ.  Keep it far below `LOGHOST_GC_GRACE_S`.  0: "
        "this host's reads load the manifest (a take-over from a host with a lease still waits "
        "for that lease)",
    )

    # A manifest that records no lease (a Rust collector's cut drops the field) may hide a longer
    # one it replaced: a take-over of it fences for the longest lease any host may hold.
    read_lease_max_ms: int = Field(
        1000,
        ge=0,
        description="the longest `LOGHOST_READ_LEASE_MS` of any host writing these logs: a host "
        "taking over a manifest that records no lease (written by Rust, whose writes drop the "
        "field, or by a version before it) fences for 1.25 x this, since that write may have "
        "erased a longer lease still answering reads.  A host's own lease may not exceed it: "
        "to raise any host's lease, first raise this on every host",
    )

    python_gc_full_threshold: int = Field(
        100,
        ge=1,
        description="collections of the interpreter's middle generation between two of its full "
        "collections (`gc.set_threshold`'s third value; Python's own default is 10).  A full "
        "collection walks every object made since start-up, a pause of tens of milliseconds for "
        "whatever request is in flight; rarer ones keep cyclic garbage a little longer",
    )

    log_level: str = Field(
        "INFO",
        description="`DEBUG`, `INFO`, `WARNING`, `ERROR` or `CRITICAL` (JSON lines on stderr)",
    )

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"listen must be HOST:PORT, got {v!r}")
        return v

    @field_validator("claim_ttl_s")
    @classmethod
    def _check_claim_ttl(cls, v: float) -> float:
        # A claimant renews every quarter of it: below a second that is a store write loop.
        if 0 < v < 1:
            raise ValueError(f"claim_ttl_s must be 0 (derived) or at least 1 s, got {v}")
        return v

    @field_validator("server_id")
    @classmethod
    def _check_server_id(cls, v: str) -> str:
        if not SERVER_ID.fullmatch(v):
            raise ValueError(
                "server_id must be letters, digits, '.', '_' and '-', starting with a letter or "
                "digit, at most 253 (a pod or host name)"
            )
        return v

    @model_validator(mode="after")
    def _check_membership(self) -> Settings:
        if self.membership_ttl_s <= self.membership_interval_s:
            raise ValueError("membership_ttl_s must be longer than membership_interval_s")
        if self.adopt_after_s <= self.membership_ttl_s:
            raise ValueError("adopt_after_s must be longer than membership_ttl_s")
        if self.read_lease_ms > self.read_lease_max_ms:
            raise ValueError(
                f"read_lease_ms ({self.read_lease_ms}) may not exceed read_lease_max_ms "
                f"({self.read_lease_max_ms}): raise read_lease_max_ms on every host first"
            )
        # A recovery may yield to a rival's claim and then fence, each 1.25 x the longest lease,
        # holding the manifest it loaded first; the collector must not delete under it.
        if 0 < self.gc_grace_s <= 2.5 * self.unrecorded_lease_s:
            raise ValueError(
                f"gc_grace_s ({self.gc_grace_s}) must exceed 2.5 x read_lease_max_ms "
                f"({2.5 * self.unrecorded_lease_s} s): a take-over's yield and fence"
            )
        return self

    @property
    def unrecorded_lease_s(self) -> float:
        """The lease a take-over assumes for a manifest that records none, the longest any host
        holds (``read_lease_max_ms``; never below this host's own)."""
        return self.read_lease_max_ms / 1000.0

    @property
    def host_port(self) -> tuple[str, int]:
        """The listen address split into host and port."""
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def public_url(self) -> str:
        """The URL other servers redirect clients to."""
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host, port = self.host_port
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        return f"http://{host}:{port}"

    def parsed_api_keys(self) -> dict[str, str]:
        """``key -> grant`` from ``api_keys`` and ``api_keys_file`` (``key=tenant``,
        ``key=tenant:read`` or ``key=*``; see ``host.auth``).  Raises ValueError."""
        keys = parse_keys(self.api_keys)
        if self.api_keys_file:
            try:
                keys = merge_keys(keys, read_keys_file(self.api_keys_file))
            except OSError as e:
                raise ValueError(f"LOGHOST_API_KEYS_FILE: {e}") from None
        return keys

    def parsed_tenant_quotas(self) -> QuotaConfig:
        """The tenant quotas of ``tenant_quotas`` with ``tenant_quotas_file``'s over them.
        Raises ValueError naming the setting and the key at fault."""
        return load_quota_config(self.tenant_quotas, self.tenant_quotas_file)


def env_name(field: str) -> str:
    """The environment variable of a setting: ``max_open_logs`` -> ``LOGHOST_MAX_OPEN_LOGS``."""
    return ENV_PREFIX + field.upper()


def unknown_env(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Every ``LOGHOST_*`` variable of ``environ`` that names no setting (a setting read from
    the environment ignores it), sorted, with the closest known name (None if none is close)."""
    known = sorted(env_name(f) for f in Settings.model_fields)
    out = []
    for name in sorted(environ):
        if name.upper().startswith(ENV_PREFIX) and name.upper() not in known:
            close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.6)
            out.append((name, close[0] if close else None))
    return out


def warn_unknown_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """Log one warning per unknown ``LOGHOST_*`` variable (at startup, once logging is set up),
    naming the closest known one; returns the unknown names."""
    found = unknown_env(os.environ if environ is None else environ)
    for name, close in found:
        hint = f"; did you mean {close}?" if close else ""
        _log.warning(
            "unknown setting %s is ignored%s",
            name,
            hint,
            extra={"variable": name, "closest": close},
        )
    return [name for name, _ in found]
