"""The one settings object: every option of the log host, from flags or ``LOGHOST_*`` variables."""

from __future__ import annotations

import socket
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .auth import merge_keys, parse_keys, read_keys_file


def _default_server_id() -> str:
    return socket.gethostname()


class Settings(BaseSettings):
    """Configuration of one log host (``LOGHOST_<FIELD>`` in the environment)."""

    model_config = SettingsConfigDict(env_prefix="LOGHOST_", extra="ignore", frozen=True)

    store: str = "./data/loghost"
    listen: str = "127.0.0.1:8080"
    server_id: str = Field(default_factory=_default_server_id)
    advertise_url: str | None = None
    redis_url: str | None = None
    api_keys: Annotated[str, NoDecode] = ""
    # A file in the LOGHOST_API_KEYS format (a mounted Secret), re-read when it changes.
    api_keys_file: str | None = None
    dev: bool = False

    # Log manager: how many logs stay open, and how much they may buffer.
    max_open_logs: int = Field(1024, ge=1)
    idle_close_s: float = Field(60.0, gt=0)
    max_log_outstanding_bytes: int = Field(16 << 20, ge=1024)
    max_buffered_bytes: int = Field(256 << 20, ge=1024)
    max_request_bytes: int = Field(8 << 20, ge=1024)
    max_records_per_request: int = Field(10_000, ge=1)
    # One record's metadata keys and embedding length at most: checked on the parsed JSON before
    # any validation, so no single validation call holds the GIL for an unbounded record.
    max_metadata_keys: int = Field(1024, ge=1)
    max_embedding_dims: int = Field(65536, ge=1)
    max_read_records: int = Field(10_000, ge=1)
    max_wait_ms: int = Field(30_000, ge=0)
    batch_interval_ms: float = Field(2.0, ge=0)
    shutdown_grace_s: float = Field(25.0, ge=0)
    # Longer than clients' idle-connection expiry (httpx: 5 s, load balancers: 60 s), so a client
    # never sends on a connection the server is closing at that moment (a lost request).
    keep_alive_s: float = Field(75.0, gt=0)
    # Slow or silent clients: a request's headers, and its body, must arrive within these, and
    # at most this many connections are open (more are closed at once).
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)
    # An answer the client does not take within this (from when its socket stops taking bytes)
    # closes the connection: a reader that never reads cannot pin its answer for ever.
    send_timeout_s: float = Field(60.0, gt=0)
    max_connections: int = Field(4096, ge=1)
    # Connections none of whose requests carried a valid key yet (probes, scrapers, strangers):
    # beyond this the oldest of them is closed; they never push out authenticated connections.
    max_unauthenticated_connections: int = Field(512, ge=1)
    # Long-polls (wait_ms) waiting at once per tenant; more answer 429.
    max_long_polls_per_tenant: int = Field(256, ge=1)

    # Garbage collection (always on, rate limited) and snapshots.
    gc_grace_s: float = Field(300.0, ge=0)
    gc_interval_s: float = Field(60.0, gt=0)
    gc_deletes_per_second: float = Field(200.0, gt=0)
    # One collection pass drops at most this share of a log's live bytes (the verifier's alarm).
    gc_max_fraction: float = Field(0.9, gt=0, le=1)
    snapshot_fragment_threshold: int = Field(100, ge=2)
    snapshot_threshold: int = Field(20, ge=2)

    # Dirty log and compaction backpressure.
    rollup_interval_s: float = Field(10.0, gt=0)
    dirty_max_age_s: float = Field(300.0, gt=0)
    dirty_max_reinserts: int = Field(10, ge=0)
    backpressure_uncompacted_records: int = Field(1_000_000, ge=1)

    # Leader hint.
    leader_ttl_ms: int = Field(10_000, ge=100)
    # Reads answer from a writer's memory for this long after the store last proved its manifest
    # current; a host taking a log over holds acknowledgements 1.25 x this (no stale read, ever,
    # whatever Redis does).  0: every read loads the manifest from the store.
    read_lease_ms: int = Field(1000, ge=0)

    log_level: str = "INFO"

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"listen must be HOST:PORT, got {v!r}")
        return v

    @field_validator("server_id")
    @classmethod
    def _check_server_id(cls, v: str) -> str:
        if not v or "/" in v or len(v) > 253:
            raise ValueError("server_id must be a non-empty name without '/'")
        return v

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
