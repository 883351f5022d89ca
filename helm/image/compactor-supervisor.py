#!/usr/bin/env python3
"""compactor-supervisor: keep `compactor run` in step with the compactor pods.

Rendezvous assignment needs every compactor to agree on the full member list.
When the replica count can change at run time (an HPA, ``kubectl scale``, a
Deployment rollout) this supervisor derives the list from the Kubernetes API
instead of taking it from the chart. Two sources (MEMBERSHIP_MODE):

* ``statefulset`` (the default): the members are exactly
  ``<statefulset>-0 .. <statefulset>-(replicas-1)``; it reads ``spec.replicas``
  of its own StatefulSet (RBAC: ``get`` on that one StatefulSet). A pod whose
  ordinal is no longer below the count (it is being scaled away) runs nothing.
* ``pods``: for a Deployment, whose pod names are random. It lists the pods
  matching MEMBERSHIP_SELECTOR (RBAC: ``list`` pods in the namespace) and takes
  the names of those that are Running, or Pending on a node, and not being
  deleted, plus always its own name, sorted. Scheduled Pending pods count so
  that a starting pod does not cause a second restart when it turns Running;
  unscheduled, terminating, Succeeded and Failed pods do not, because they will
  not (or no longer) compact.

In both modes it polls every MEMBERSHIP_POLL_S seconds and:

* runs the given command (normally ``compactor run``) with COMPACTOR_MEMBERS set
  to the list and COMPACTOR_MEMBER_ID to this pod's name;
* when the list changes, stops the command (SIGTERM, then SIGKILL after
  MEMBERSHIP_STOP_GRACE_S) and starts it again with the new list;
* forwards SIGTERM/SIGINT to the command; its exit status becomes ours, and if
  it exits on its own, so does the supervisor (the kubelet restarts it).

Standard library only; configured by environment:

  MEMBERSHIP_MODE          statefulset (default) or pods
  MEMBERSHIP_STATEFULSET   statefulset mode (required): the StatefulSet name
  MEMBERSHIP_SELECTOR      pods mode (required): label selector, e.g. app=x,component=y
  MEMBERSHIP_NAMESPACE     default: the service account's namespace file
  MEMBERSHIP_POLL_S        default 30
  MEMBERSHIP_STOP_GRACE_S  default 30
  MEMBERSHIP_API_URL       default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
  MEMBERSHIP_TOKEN_FILE    default /var/run/secrets/kubernetes.io/serviceaccount/token
  MEMBERSHIP_CA_FILE       default /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
  POD_NAME                 this pod's name (COMPACTOR_MEMBER_ID is used if unset)

Its own log lines are JSON on stderr, shaped like the compactor's (``ts`` in RFC 3339 UTC,
``level``, ``logger`` = ``compactor.supervisor``, ``msg``, then fields of their own), so one
log pipeline parses the pod's whole output; a configuration error is one such line and exit
status 2.

Usage: compactor-supervisor [--] COMMAND [ARG...]
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


LOGGER = "compactor.supervisor"


def log(message: str, level: str = "info", **fields: object) -> None:
    """One JSON line on stderr (the compactor's shape: compactor_client.logs)."""
    now = time.time()
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    line = {"ts": ts, "level": level, "logger": LOGGER, "msg": message, **fields}
    print(json.dumps(line, default=str), file=sys.stderr, flush=True)


class Config:
    def __init__(self, env: dict[str, str]) -> None:
        self.mode = env.get("MEMBERSHIP_MODE", "") or "statefulset"
        if self.mode not in ("statefulset", "pods"):
            raise SystemExit(
                f"compactor-supervisor: MEMBERSHIP_MODE must be statefulset or pods, not {self.mode!r}"
            )
        self.statefulset = env.get("MEMBERSHIP_STATEFULSET", "")
        if self.mode == "statefulset" and not self.statefulset:
            raise SystemExit("compactor-supervisor: MEMBERSHIP_STATEFULSET is required")
        self.selector = env.get("MEMBERSHIP_SELECTOR", "")
        if self.mode == "pods" and not self.selector:
            # An empty selector would list every pod in the namespace.
            raise SystemExit("compactor-supervisor: MEMBERSHIP_SELECTOR is required in pods mode")
        namespace = env.get("MEMBERSHIP_NAMESPACE", "")
        if not namespace and (SA_DIR / "namespace").is_file():
            namespace = (SA_DIR / "namespace").read_text().strip()
        if not namespace:
            raise SystemExit("compactor-supervisor: MEMBERSHIP_NAMESPACE is required")
        self.namespace = namespace
        self.poll_s = float(env.get("MEMBERSHIP_POLL_S", "30"))
        self.stop_grace_s = float(env.get("MEMBERSHIP_STOP_GRACE_S", "30"))
        api = env.get("MEMBERSHIP_API_URL", "")
        if not api:
            host = env.get("KUBERNETES_SERVICE_HOST", "")
            port = env.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise SystemExit(
                    "compactor-supervisor: no MEMBERSHIP_API_URL and no KUBERNETES_SERVICE_HOST"
                )
            if ":" in host:  # IPv6 literal
                host = f"[{host}]"
            api = f"https://{host}:{port}"
        self.api = api.rstrip("/")
        self.token_file = Path(env.get("MEMBERSHIP_TOKEN_FILE", str(SA_DIR / "token")))
        self.ca_file = Path(env.get("MEMBERSHIP_CA_FILE", str(SA_DIR / "ca.crt")))
        self.pod_name = env.get("POD_NAME") or env.get("COMPACTOR_MEMBER_ID", "")
        if not self.pod_name:
            raise SystemExit("compactor-supervisor: POD_NAME (or COMPACTOR_MEMBER_ID) is required")


def api_get(cfg: Config, path: str) -> dict:
    """GET a path from the API server as JSON, authenticated as the pod's service account."""
    url = f"{cfg.api}{path}"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if cfg.token_file.is_file():  # re-read every time: projected tokens rotate
        request.add_header("Authorization", f"Bearer {cfg.token_file.read_text().strip()}")
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(
            cafile=str(cfg.ca_file) if cfg.ca_file.is_file() else None
        )
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        body = json.load(response)
    if not isinstance(body, dict):
        raise TypeError(f"unexpected API response {type(body).__name__}")
    return body


def read_replicas(cfg: Config) -> int:
    """spec.replicas of the StatefulSet (Kubernetes defaults a missing value to 1)."""
    body = api_get(cfg, f"/apis/apps/v1/namespaces/{cfg.namespace}/statefulsets/{cfg.statefulset}")
    replicas = body.get("spec", {}).get("replicas", 1)
    if not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"unexpected spec.replicas {replicas!r}")
    return replicas


def members_for(statefulset: str, replicas: int) -> list[str]:
    return [f"{statefulset}-{i}" for i in range(replicas)]


def list_pods(cfg: Config) -> list[dict]:
    """The pods matching the selector in the namespace (one unpaginated list)."""
    query = urllib.parse.urlencode({"labelSelector": cfg.selector})
    body = api_get(cfg, f"/api/v1/namespaces/{cfg.namespace}/pods?{query}")
    items = body.get("items")
    if not isinstance(items, list):  # an error Status has no items: never read it as "no pods"
        raise TypeError(f"unexpected pod list (kind {body.get('kind')!r})")
    return items


def members_from_pods(pods: list[dict], own: str) -> list[str]:
    """Names of the pods that are or will be compacting, always including our own, sorted."""
    names = {own}
    for pod in pods:
        meta = pod.get("metadata") or {}
        name = meta.get("name")
        if not name or meta.get("deletionTimestamp"):
            continue
        phase = (pod.get("status") or {}).get("phase")
        # A Pending pod counts only once scheduled: one that never fits anywhere must not
        # hold a share of the collections that nobody then compacts.
        scheduled = bool((pod.get("spec") or {}).get("nodeName"))
        if phase == "Running" or (phase == "Pending" and scheduled):
            names.add(name)
    return sorted(names)


class Supervisor:
    def __init__(self, cfg: Config, command: list[str]) -> None:
        self.cfg = cfg
        self.command = command
        self.child: subprocess.Popen[bytes] | None = None
        self.members: list[str] | None = None
        self.stopping = False
        # Signal the child once: a second SIGTERM can cut its flush short.
        self.child_signalled = False

    def source(self) -> str:
        if self.cfg.mode == "pods":
            return f"pods matching {self.cfg.selector}"
        return f"StatefulSet {self.cfg.statefulset}"

    def read_members(self) -> list[str]:
        if self.cfg.mode == "pods":
            return members_from_pods(list_pods(self.cfg), self.cfg.pod_name)
        return members_for(self.cfg.statefulset, read_replicas(self.cfg))

    def on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None and not self.child_signalled:
            self.child_signalled = True
            self.child.send_signal(signum)

    def start(self, members: list[str]) -> None:
        env = dict(os.environ)
        env["COMPACTOR_MEMBERS"] = ",".join(members)
        env["COMPACTOR_MEMBER_ID"] = self.cfg.pod_name
        log(
            f"starting {' '.join(self.command)} as {self.cfg.pod_name} of {len(members)} members",
            member_id=self.cfg.pod_name,
            members=len(members),
        )
        self.child_signalled = False
        self.child = subprocess.Popen(self.command, env=env)
        self.members = members

    def stop(self) -> int:
        child, self.child = self.child, None
        if child is None:
            return 0
        if child.poll() is None:
            if not self.child_signalled:
                self.child_signalled = True
                child.terminate()
            try:
                child.wait(self.cfg.stop_grace_s)
            except subprocess.TimeoutExpired:
                log("compactor did not stop in time; killing it", "warning")
                child.kill()
        return child.wait()

    def run(self) -> int:
        backoff = min(self.cfg.poll_s, 5.0)
        next_poll = 0.0
        while True:
            if self.stopping:
                return self.stop()
            if self.child is not None and self.child.poll() is not None:
                code = self.child.returncode
                log(
                    f"compactor exited with status {code}",
                    "info" if code == 0 else "warning",
                    status=code,
                )
                return code
            now = time.monotonic()
            if now >= next_poll:
                try:
                    members = self.read_members()
                except Exception as exc:  # API hiccup: keep the current membership
                    log(f"cannot read the members ({self.source()}): {exc}", "warning")
                    next_poll = now + (backoff if self.members is None else self.cfg.poll_s)
                else:
                    next_poll = now + self.cfg.poll_s
                    if self.cfg.pod_name not in members:  # statefulset mode: scaled away
                        if self.child is not None:
                            log(f"{self.cfg.pod_name} is no longer a member; stopping compactor")
                            self.stop()
                        self.members = members
                    elif members != self.members or self.child is None:
                        if self.child is not None:
                            log(
                                f"membership changed to {len(members)} members; restarting",
                                members=len(members),
                            )
                            self.stop()
                        if self.stopping:
                            continue
                        self.start(members)
            time.sleep(0.1)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        cfg = Config(dict(os.environ))
    except SystemExit as exc:  # a configuration error: one JSON line, status 2
        if not isinstance(exc.code, str):
            raise
        log(exc.code.removeprefix("compactor-supervisor: "), "error")
        return 2
    except ValueError as exc:  # e.g. MEMBERSHIP_POLL_S not a number
        log(f"invalid configuration: {exc}", "error")
        return 2
    supervisor = Supervisor(cfg, argv)
    signal.signal(signal.SIGTERM, supervisor.on_signal)
    signal.signal(signal.SIGINT, supervisor.on_signal)
    code = supervisor.run()
    return 128 - code if code < 0 else code  # killed by signal N -> 128+N, like a shell


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
