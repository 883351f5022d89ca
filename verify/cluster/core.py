"""A cluster in a box: N log hosts over one store, Redis, M compactors, and HAProxy in front.

Every part is a real process: ``loghost serve`` per host (own 127.0.0.1 port and server id, one
shared store), ``redis-server`` (optional), ``compactor run`` per compactor (with membership), and
HAProxy from the distribution's package, round-robin over the hosts with health checks, as a
Kubernetes Service spreads requests over ready pods.  Children run in their own session (a
Ctrl-C reaches only the supervisor, which stops them in order) and die with the supervisor
(``PR_SET_PDEATHSIG``), so none outlives it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

import httpx

from verify.testkit import RedisServer, free_port, redis_executable, wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TENANT = "demo"

Engine = Literal["local", "spark"]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor (the parent thread) dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _sudo() -> list[str]:
    if os.geteuid() != 0 and shutil.which("sudo"):
        return ["sudo"]
    return []


def ensure_package(binary: str, package: str) -> str:
    """The path of ``binary``, installing Debian's ``package`` with apt-get when it is missing."""
    found = shutil.which(binary) or next(
        (p for d in ("/usr/sbin", "/usr/bin") if os.path.exists(p := f"{d}/{binary}")), None
    )
    if found:
        return found
    print(f"{binary} is missing: apt-get install {package}", file=sys.stderr, flush=True)
    subprocess.run([*_sudo(), "apt-get", "update", "-qq"], check=False, stdout=subprocess.DEVNULL)
    subprocess.run(
        [*_sudo(), "apt-get", "install", "-y", "-qq", package],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    found = shutil.which(binary) or (f"/usr/sbin/{binary}" if package == "haproxy" else None)
    if not found or not os.path.exists(found):
        raise RuntimeError(f"{binary} is not installed after apt-get install {package}")
    return found


class Child:
    """One child process with its log file: started in its own session, stopped in order."""

    def __init__(self, name: str, cmd: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.env = dict(env)
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []  # every process started for it (restarts included)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out: IO[bytes]
        with open(self.log_path, "ab") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                self.cmd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.pids.append(self.proc.pid)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_running(self) -> bool:
        """False while running; raises if it exited (a readiness poll fails fast with its log)."""
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")
        return False

    def kill9(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM and wait for the exit; SIGKILL after ``timeout_s``."""
        self.terminate()
        self.wait_stopped(timeout_s)

    def terminate(self) -> None:
        """SIGTERM, without waiting (:meth:`wait_stopped` waits)."""
        if self.running():
            assert self.proc is not None
            self.proc.terminate()

    def wait_stopped(self, timeout_s: float = 30.0) -> None:
        """Wait for the exit; SIGKILL after ``timeout_s``."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


@dataclass
class Host:
    """One ``loghost serve`` process."""

    server_id: str
    port: int
    child: Child
    killed: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.child.pid

    def running(self) -> bool:
        return self.child.running()

    def healthy(self) -> bool:
        self.child.check_running()
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def ready(self) -> bool:
        """Started: joined the membership, its dirty log open (``/readyz`` answers 200 only
        then; ``/healthz`` answers while it starts)."""
        self.child.check_running()
        try:
            return httpx.get(self.url + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False


@dataclass
class Compactor:
    """One ``compactor run`` process."""

    member_id: str
    child: Child


@dataclass
class Cluster:
    """What :func:`start` started; :meth:`close` stops all of it (idempotent)."""

    workdir: Path
    store: str
    service_key: str
    tenant_key: str
    front_port: int
    hosts: list[Host]
    compactors: list[Compactor] = field(default_factory=list)
    redis: RedisServer | None = None
    haproxy: Child | None = None
    engine: Engine = "local"
    # What the parts are started with (kept so hosts, compactors and the front can be started
    # again, or added, while the cluster runs).
    host_env: dict[str, str] = field(default_factory=dict)
    host_env_by_id: dict[str, dict[str, str]] = field(default_factory=dict)  # over host_env
    spark_master: str = "local[1]"
    compactor_args: list[str] = field(default_factory=list)
    haproxy_bin: str = "haproxy"
    timeout_s: float = 60.0

    @property
    def front_url(self) -> str:
        return f"http://127.0.0.1:{self.front_port}"

    @property
    def host_urls(self) -> list[str]:
        return [h.url for h in self.hosts]

    def host(self, which: Host | str | int) -> Host:
        if isinstance(which, Host):
            return which
        if isinstance(which, int):
            return self.hosts[which]
        return next(h for h in self.hosts if h.server_id == which)

    def kill9(self, which: Host | str | int) -> Host:
        """SIGKILL a host: no drain, no flush, its liveness record left to age."""
        h = self.host(which)
        h.child.kill9()
        h.killed = True
        return h

    def stop(self, which: Host | str | int, timeout_s: float = 60.0) -> Host:
        """SIGTERM a host and wait for its graceful exit (it drains first)."""
        h = self.host(which)
        h.child.stop(timeout_s)
        return h

    def restart(self, which: Host | str | int) -> Host:
        """Start a stopped (or killed) host again: same server id, port and store; returns once
        it has joined the membership (``/readyz`` answers 200)."""
        h = self.host(which)
        if h.running():
            raise RuntimeError(f"host {h.server_id} is still running")
        h.child.start()
        h.killed = False
        wait_until_sync(h.ready, f"log host {h.server_id} to be ready", self.timeout_s, 0.05)
        return h

    def add_hosts(self, n: int, *, restart_compactors: bool = True) -> list[Host]:
        """Scale out: start ``n`` new hosts (``host-<next>``), wait until they are ready, put them
        behind the front (HAProxy reloads its configuration, connections in flight finish) and
        restart the compactors one at a time with the new host list (as the chart re-renders
        ``COMPACTOR_HOSTS``; ``restart_compactors=False`` leaves that to the caller's
        :meth:`restart_compactors`).  Returns the new hosts."""
        first = max((int(h.server_id.rsplit("-", 1)[1]) for h in self.hosts), default=-1) + 1
        new = [self._spawn_host(f"host-{first + i}") for i in range(n)]
        new = [self._await_first_start(h, "be ready", Host.ready) for h in new]
        self.reload_front()
        if restart_compactors:
            self.restart_compactors()
        return new

    def reload_front(self) -> None:
        """Rewrite HAProxy's configuration for the current hosts and reload it gracefully
        (master-worker SIGUSR2: a new worker takes new connections, the old one finishes its
        requests); returns once every host's ``/healthz`` has answered through the front."""
        assert self.haproxy is not None and self.haproxy.proc is not None
        self._write_front_config()
        self.haproxy.proc.send_signal(signal.SIGUSR2)
        want = {h.server_id for h in self.hosts if h.running()}
        seen: set[str] = set()

        def all_seen() -> bool:
            assert self.haproxy is not None
            self.haproxy.check_running()
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = httpx.get(self.front_url + "/healthz", timeout=1)
                if r.status_code == 200:
                    seen.add(str(r.json().get("server_id")))
            return want <= seen

        wait_until_sync(all_seen, f"the front to reach every host of {sorted(want)}", 30, 0.02)

    def restart_compactors(self) -> None:
        """Restart every compactor, one at a time, with the current host list."""
        for c in self.compactors:
            c.child.stop(30)
            c.child.cmd = self._compactor_cmd(c.member_id)
            c.child.start()

    def kill_redis(self) -> None:
        """SIGKILL redis-server: every leader hint is gone with it."""
        assert self.redis is not None
        self.redis.stop()

    def start_redis(self) -> None:
        """Start redis-server again on its port, empty; returns once it answers PING."""
        assert self.redis is not None
        self.redis.start()

    def all_pids(self) -> list[int | None]:
        """Every process the cluster started (restarts included) and the current redis-server."""
        children = [h.child for h in self.hosts] + [c.child for c in self.compactors]
        children += [self.haproxy] if self.haproxy is not None else []
        return [
            *(pid for ch in children for pid in ch.pids),
            self.redis.proc.pid if self.redis is not None and self.redis.proc else None,
        ]

    # --------------------------------------------------------------------------- starting

    def _spawn_host(self, sid: str) -> Host:
        env = _base_env()
        env.update(
            {
                "LOGHOST_API_KEYS": f"{self.service_key}=*,{self.tenant_key}={TENANT}",
                "LOGHOST_LOG_LEVEL": "WARNING",
                **({"LOGHOST_REDIS_URL": self.redis.url} if self.redis else {}),
                **self.host_env,
                **self.host_env_by_id.get(sid, {}),
            }
        )
        loghost = [str(BIN / "loghost")] if (BIN / "loghost").exists() else None
        port = free_port()
        cmd = [
            *(
                loghost
                or [
                    sys.executable,
                    "-c",
                    "import sys; from host.cli import main; sys.exit(main(sys.argv[1:]))",
                ]
            ),
            "serve",
            "--store",
            self.store,
            "--listen",
            f"127.0.0.1:{port}",
            "--server-id",
            sid,
        ]
        h = Host(sid, port, Child(sid, cmd, env, self.workdir / "logs" / f"{sid}.log"))
        self.hosts.append(h)
        h.child.start()
        return h

    def _await_first_start(self, h: Host, what: str, up: Callable[[Host], bool]) -> Host:
        """Wait until a newly spawned host is ``up``.  Its port was free when chosen, but another
        process may bind it before the host does (EADDRINUSE, seen on CI): then, since the front
        does not list the host yet, it is spawned again on a new port, in the same place."""
        for attempt in range(3):
            try:
                wait_until_sync(
                    functools.partial(up, h),
                    f"log host {h.server_id} to {what}",
                    self.timeout_s,
                    0.05,
                )
                return h
            except RuntimeError as e:
                if "address already in use" not in str(e).lower() or attempt == 2:
                    raise
                at = self.hosts.index(h)
                self.hosts.remove(h)
                h = self._spawn_host(h.server_id)
                self.hosts.remove(h)
                self.hosts.insert(at, h)
        raise AssertionError("unreachable")

    def _write_front_config(self) -> Path:
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(haproxy_config(self.front_port, self.hosts))
        return cfg

    def _compactor_cmd(self, member_id: str) -> list[str]:
        members = [c.member_id for c in self.compactors]
        cmd = [str(BIN / "compactor"), "run"]
        cmd += (
            ["--spark-master", self.spark_master]
            if self.engine == "spark"
            else ["--engine", "local"]
        )
        return [
            *cmd,
            "--hosts",
            ",".join(self.host_urls),
            "--store",
            self.store,
            "--member-id",
            member_id,
            "--members",
            ",".join(members),
            *self.compactor_args,
        ]

    def describe(self) -> str:
        """Where everything is, one line each."""
        lines = [
            f"front (haproxy, round-robin): {self.front_url}",
            *(f"host {h.server_id}: {h.url} (pid {h.pid})" for h in self.hosts),
            f"store: {self.store}",
            f"redis: {self.redis.url if self.redis else 'none (membership routing)'}",
            *(
                f"compactor {c.member_id} ({self.engine}): pid {c.child.pid}"
                for c in self.compactors
            ),
            f"service key (key=*): {self.service_key}",
            f"tenant key ({TENANT}): {self.tenant_key}",
            f"logs: {self.workdir / 'logs'}",
        ]
        return "\n".join(lines)

    def close(self) -> None:
        """Stop everything: compactors, the front, the hosts (draining), Redis.  The parts of one
        kind get SIGTERM together and drain side by side (one host's drain and flush does not
        wait for another's)."""
        _stop_together([c.child for c in self.compactors], 30)
        if self.haproxy is not None:
            _stop_together([self.haproxy], 10)
        _stop_together([h.child for h in self.hosts], 60)
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop_together(children: Sequence[Child], timeout_s: float) -> None:
    """SIGTERM every child, then wait for each (SIGKILL after ``timeout_s``); errors ignored."""
    for ch in children:
        with contextlib.suppress(Exception):
            ch.terminate()
    for ch in children:
        with contextlib.suppress(Exception):
            ch.wait_stopped(timeout_s)


def haproxy_config(front_port: int, hosts: Sequence[Host]) -> str:
    """Round-robin over the hosts, health-checked on /healthz, bound to 127.0.0.1 only."""
    servers = "\n".join(f"    server {h.server_id} 127.0.0.1:{h.port} check" for h in hosts)
    return f"""global
    maxconn 4096
    # A reload's old worker finishes its requests, then exits (keep-alive clients move over).
    hard-stop-after 30s

defaults
    mode http
    timeout connect 2s
    timeout client 90s
    timeout server 90s
    timeout http-keep-alive 60s
    # A connection refused (a dead host not yet marked down) is tried on another host; a request
    # already sent is never re-sent by the balancer (the client decides, by idempotency key).
    retries 2
    option redispatch

frontend front
    bind 127.0.0.1:{front_port}
    default_backend hosts

backend hosts
    balance roundrobin
    option httpchk GET /healthz
    http-check expect status 200
    # A host is marked down after 3 failed checks a second apart, each given 5 s: a host that is
    # merely slow (a loaded machine, a long event-loop turn) stays in; with every host marked
    # down HAProxy itself answers 503 to everyone.  A dead host refuses connections at once, and
    # those requests go to another host (retries, redispatch) until its checks mark it down.
    timeout check 5s
    default-server inter 1s fall 3 rise 1
{servers}
"""


def _base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LOGHOST_", "COMPACTOR_", "PYSPARK_"))
    }
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start(
    n_hosts: int = 3,
    n_compactors: int = 2,
    redis: bool = False,
    store: str | None = None,
    *,
    workdir: Path | None = None,
    engine: Engine = "local",
    spark_master: str = "local[1]",
    host_env: Mapping[str, str] | None = None,
    host_env_by_id: Mapping[str, Mapping[str, str]] | None = None,
    compactor_args: Sequence[str] = (),
    timeout_s: float = 60.0,
) -> Cluster:
    """Start the cluster and return once every part answers; on failure nothing is left running.

    ``store``: a path or ``s3://bucket/prefix`` (the endpoint and credentials from the ``AWS_*``
    variables, passed on to every child); default ``workdir/store``.  ``host_env``: extra
    ``LOGHOST_*`` settings for every host, ``host_env_by_id`` for some hosts (by server id,
    ``host-<i>``) over those.  ``engine``: ``local`` folds in each compactor's process
    (``compactor run --engine local``), ``spark`` runs ``compactor run`` on ``spark_master``.
    """
    if n_hosts < 1:
        raise ValueError("n_hosts must be at least 1")
    workdir = workdir or Path(tempfile.mkdtemp(prefix="loghost-cluster-"))
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    store = store or str(workdir / "store")
    service_key = "svc-" + secrets.token_urlsafe(18)
    tenant_key = f"{TENANT}-" + secrets.token_urlsafe(18)
    haproxy_bin = ensure_package("haproxy", "haproxy")
    if redis and redis_executable() is None:
        ensure_package("redis-server", "redis-server")

    cluster = Cluster(
        workdir=workdir,
        store=store,
        service_key=service_key,
        tenant_key=tenant_key,
        front_port=free_port(),
        hosts=[],
        engine=engine,
        host_env=dict(host_env or {}),
        host_env_by_id={sid: dict(env) for sid, env in (host_env_by_id or {}).items()},
        spark_master=spark_master,
        compactor_args=list(compactor_args),
        haproxy_bin=haproxy_bin,
        timeout_s=timeout_s,
    )
    try:
        if redis:
            cluster.redis = RedisServer(workdir / "redis")
            cluster.redis.start()

        for i in range(n_hosts):
            cluster._spawn_host(f"host-{i}")
        for h in list(cluster.hosts):
            cluster._await_first_start(h, "answer /healthz", Host.healthy)

        cfg = cluster._write_front_config()
        # Master-worker (-W) in the foreground (-db): SIGUSR2 reloads the configuration.
        cluster.haproxy = Child(
            "haproxy",
            [haproxy_bin, "-W", "-db", "-f", str(cfg)],
            _base_env(),
            logs / "haproxy.log",
        )
        cluster.haproxy.start()

        def front_up() -> bool:
            assert cluster.haproxy is not None
            cluster.haproxy.check_running()
            try:
                r = httpx.get(cluster.front_url + "/healthz", timeout=1)
            except httpx.HTTPError:
                return False
            return r.status_code == 200

        wait_until_sync(front_up, "haproxy to answer on the front address", timeout_s, 0.05)

        cenv = _base_env()
        cenv["COMPACTOR_API_KEY"] = service_key
        members = [f"compactor-{j}" for j in range(n_compactors)]
        cluster.compactors = [
            Compactor(mid, Child(mid, [], cenv, logs / f"{mid}.log")) for mid in members
        ]
        for c in cluster.compactors:
            c.child.cmd = cluster._compactor_cmd(c.member_id)
            c.child.start()
        return cluster
    except BaseException:
        cluster.close()
        raise


@contextlib.contextmanager
def closed_after(cluster: Cluster) -> Iterator[Cluster]:
    """Yield the cluster, then close it and assert that no process it started outlived that."""
    try:
        yield cluster
    finally:
        pids = cluster.all_pids()  # the current redis-server's too, gone from the list once closed
        cluster.close()
        left = process_tree_alive([*pids, *cluster.all_pids()])
        assert left == [], f"cluster processes outlived close(): {left}"


def process_tree_alive(pids: Sequence[int | None]) -> list[int]:
    """Which of ``pids`` still exist (zombies count as gone)."""
    out = []
    for pid in pids:
        if pid is None:
            continue
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.append(pid)
    return out


__all__ = [
    "Child",
    "Cluster",
    "Compactor",
    "Engine",
    "Host",
    "closed_after",
    "ensure_package",
    "haproxy_config",
    "process_tree_alive",
    "start",
]
