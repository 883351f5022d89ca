"""Every shell and Python sample of the user-facing docs runs, as written, against a live host.

The fenced code blocks of ``DOCS`` are extracted and each one is either

* **run**: a shell block (``sh``) with bash, a Python block (``python``) in a subprocess with the
  repository on ``PYTHONPATH``; both against one ``loghost serve --dev`` subprocess on a free
  127.0.0.1 port (started as ``make run`` starts it, its store ``./data/loghost`` under the
  working directory the samples run in) and, for ``s3://bucket/prefix``, a moto S3 server;
* or **listed** in ``NOT_RUNNABLE`` by its stable id (file, heading, first line) with the reason
  it cannot run here (a Kubernetes cluster, PromQL, Helm values, a docker build, Spark, ...).

A block that is neither fails ``test_every_sample_is_run_or_listed``: a new sample must run, or be
listed with a reason by whoever reviews it.  A listed id that matches no block fails too, so the
list does not rot.

Placeholders: the docs address a reader's own host, so the samples are adapted to the test's host
by this fixed table and nothing else:

* ``http://127.0.0.1:8080`` (``make run``'s address), an in-cluster pod URL
  ``http://loghost-<i>.loghost-headless.logs.svc[.cluster.local]:8080`` and the example hosts
  ``http://h1:8080``, ``http://h2:8080`` are the test's host;
* a shell line ``NAME=...`` or ``export NAME=...`` (the literal ``...``: "fill in yours") takes
  ``NAME`` from the test, which knows ``KEY``, ``SERVICE_KEY`` and ``COMPACTOR_API_KEY`` (the
  ``--dev`` service key); a ``...`` of another name fails the test;
* ``"my-api-key"`` in Python is the same key, and so is ``$SERVICE_KEY``, which the runbooks
  assume an operator has set.

A sample that assumes earlier steps (a host that was scaled in and left its dirty log, the quick
start's log) gets them from ``PRECONDITIONS``, by block id.  ``kubectl``, ``helm``, ``docker``
and ``make`` are stubs that fail: a sample needing them must be listed, and never reaches a
cluster that the machine might be configured for.

Shell blocks run under ``bash -euo pipefail`` with ``curl`` failing on an HTTP error
(``--fail-with-body``: ``curl -s`` alone exits 0 on a 400).  ``compactor`` is the real CLI (its
parser and settings, ``compactor_client.cli.main``) with ``run`` stopped before Spark: it opens
the store, checks the key with every host (``check_key``) and that each host answers ``/readyz``,
and exits; a Spark round takes a JVM start (about 17 s here) and is covered by
``tests/compactor_client``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.host.live import CID, KEYS, Proc, auth, spawn_server

REPO = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "compactor_client/README.md", "docs/OPERATIONS.md", "helm/loghost/README.md")
SHELL = frozenset({"sh", "bash", "shell"})
PYTHON = frozenset({"python", "py"})
TIMEOUT_S = 120  # a bound on one sample, not an expectation: they take about a second

# ------------------------------------------------------------------------------------------------
# The reviewed list of blocks that do not run here, by id, with the reason.

CLUSTER = "kubectl/helm against a Kubernetes cluster"
VALUES = "Helm values (YAML), not a command; the chart's tests render values like them"
PROMQL = "PromQL for a Prometheus that scrapes a cluster"
DOCKER = "docker build and push of the image (a registry, and minutes of build)"
INI = "the contents of an AWS shared-credentials file, not a command"
LAYOUT = "the layout of the compacted objects in the store, not code"
SPARK = "needs a SparkSession (a JVM start) and compacted collections; see tests/compactor_client"

NOT_RUNNABLE: dict[str, str] = {
    # README.md
    "README.md § Quick start § make run    # the log host on the embedded local store "
    "./data/loghost, at http://127.0.0.1:8080": "starts a server in the foreground on port 8080 "
    "(the test runs the same `loghost serve --dev` on a free port) and runs the whole suite",
    # compactor_client/README.md
    "compactor_client/README.md § Output layout: levels of sorted runs § "
    "compacted/{collection_id}/v{version:016d}/run-{token}-{n}.parquet   "
    "a sorted run: one entry per id": LAYOUT,
    "compactor_client/README.md § Reading compacted collections § "
    "from compactor_client.reader import read_collections": SPARK,
    # docs/OPERATIONS.md
    "docs/OPERATIONS.md § Build the image § "
    "docker build -f helm/image/Dockerfile -t registry.example.com/loghost:0.1.0 .": DOCKER,
    "docs/OPERATIONS.md § 1. Namespace and Secrets § kubectl create namespace logs": CLUSTER,
    "docs/OPERATIONS.md § 1. Namespace and Secrets § serviceAccount:": VALUES,
    "docs/OPERATIONS.md § 2. Values § image:": VALUES,
    "docs/OPERATIONS.md § 2. Values § "
    '# External Redis for the leader hint (advisory; see "The Redis hint" below).': VALUES,
    "docs/OPERATIONS.md § 3. Install and check § "
    "helm install loghost ./helm/loghost -n logs -f values-prod.yaml": CLUSTER,
    "docs/OPERATIONS.md § Upgrade § "
    "helm upgrade loghost ./helm/loghost -n logs -f values-prod.yaml": CLUSTER,
    "docs/OPERATIONS.md § Scaling log hosts out § "
    "helm upgrade loghost ./helm/loghost -n logs --reuse-values --set host.replicas=5": CLUSTER,
    "docs/OPERATIONS.md § Recommended: drain, then scale in § "
    "kubectl -n logs label pod loghost-4 loghost/serving=false --overwrite": CLUSTER,
    "docs/OPERATIONS.md § Recommended: drain, then scale in § "
    'loghost_open_logs{namespace="logs", pod=~"loghost-[34]"}           '
    "# -> 0 (idle close: LOGHOST_IDLE_CLOSE_S)": PROMQL,
    "docs/OPERATIONS.md § Uninstall § helm uninstall loghost -n logs": CLUSTER,
    "docs/OPERATIONS.md § Testing the chart § .venv/bin/python -m pytest tests/helm -q": (
        "runs the chart's test suite (tests/helm), which the suite itself runs"
    ),
    # helm/loghost/README.md
    "helm/loghost/README.md § loghost Helm chart § "
    "docker build -f helm/image/Dockerfile -t registry.example.com/loghost:0.1.0 .   "
    "# from the repo root": f"{DOCKER}; then {CLUSTER}",
    "helm/loghost/README.md § Server settings: `host.config` § host:": VALUES,
    "helm/loghost/README.md § Extension points § store:": VALUES,
    "helm/loghost/README.md § Secrets: files rather than environment variables § [default]": INI,
}

# ------------------------------------------------------------------------------------------------
# Extraction.

FENCE = re.compile(r"^(?P<indent> {0,3}|\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(?P<text>.*?)\s*#*\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a doc."""

    doc: str
    heading: str
    lang: str
    code: str
    line: int  # of the opening fence, 1-based

    @property
    def first_line(self) -> str:
        return next((ln.strip() for ln in self.code.splitlines() if ln.strip()), "")

    @property
    def id(self) -> str:
        """Stable while the block's file, heading and first line stay."""
        return f"{self.doc} § {self.heading} § {self.first_line}"

    def __str__(self) -> str:
        return f"{self.doc}:{self.line} ({self.lang or 'no language'}) {self.first_line!r}"


def extract(doc: str, text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, each with the heading it is under."""
    blocks: list[Block] = []
    heading = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            h = HEADING.match(lines[i])
            if h is not None:
                heading = h.group("text")
            i += 1
            continue
        indent, fence = len(m.group("indent")), m.group("fence")
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                break
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        else:
            raise AssertionError(f"{doc}:{i + 1}: a code fence that is never closed")
        lang = m.group("info").split()[0].lower() if m.group("info").strip() else ""
        blocks.append(Block(doc, heading, lang, "\n".join(body) + "\n", i + 1))
        i = j + 1
    return blocks


def all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in extract(doc, (REPO / doc).read_text(encoding="utf-8"))]


BLOCKS = all_blocks()


def runnable(block: Block) -> bool:
    return block.id not in NOT_RUNNABLE and block.lang in SHELL | PYTHON


RUNNABLE = [b for b in BLOCKS if runnable(b)]

# ------------------------------------------------------------------------------------------------
# Placeholders.

HOST_URLS = re.compile(
    r"http://(?:127\.0\.0\.1|h[0-9]|loghost-[0-9]+\.loghost-headless\.logs\.svc"
    r"(?:\.cluster\.local)?):8080"
)
PLACEHOLDER = re.compile(r"^(?P<lead>\s*(?:export\s+)?)(?P<name>[A-Za-z_]\w*)=\.\.\.(?=\s|$)", re.M)
KEY_NAMES = ("KEY", "SERVICE_KEY", "COMPACTOR_API_KEY")
PY_KEY = '"my-api-key"'


def adapt_shell(code: str, url: str) -> str:
    """The shell sample pointed at the test's host; its ``NAME=...`` lines taken from the test."""

    def fill(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in KEY_NAMES:
            raise AssertionError(f"placeholder {name}=... is not one the test knows {KEY_NAMES}")
        return f'{m.group("lead")}{name}="${{__DOC_{name}:?}}"'

    return PLACEHOLDER.sub(fill, HOST_URLS.sub(url, code))


def adapt_python(code: str, url: str, key: str) -> str:
    """The Python sample pointed at the test's host and key."""
    return HOST_URLS.sub(url, code).replace(PY_KEY, repr(key))


# ------------------------------------------------------------------------------------------------
# The live host and the sandbox the samples run in.

CURL = """#!/bin/sh
# curl as the samples call it, but an HTTP error is a failure (curl -s alone exits 0 on a 400).
exec {curl} --fail-with-body "$@"
"""

OFF_LIMITS = """#!/bin/sh
# Doc samples never reach a cluster, a registry or a daemon: such a sample must be listed.
echo "$(basename "$0"): not available to doc samples (list the block in NOT_RUNNABLE)" >&2
exit 127
"""
CLUSTER_TOOLS = ("kubectl", "helm", "docker", "make")

COMPACTOR = '''#!{python}
"""compactor, with `run` stopped before Spark: the real parser and settings, the store opened,
the key checked with every host (check_key), and every host answering /readyz."""
import asyncio, sys

import httpx

from compactor_client import cli
from compactor_client.client import LogHostClient
from compactor_client.stores import open_object_store


async def dry_run(settings, **_):
    store = await open_object_store(settings.store)
    clients = {{h: LogHostClient(h, settings.api_key) for h in settings.hosts}}
    try:
        await cli.check_key(clients)
        for h in settings.hosts:
            httpx.get(h + "/readyz", timeout=10).raise_for_status()
    finally:
        for c in clients.values():
            await c.aclose()
        await store.close()
    print("compactor (dry run): settings ok, key accepted by", ", ".join(settings.hosts))
    return 0


cli.run = dry_run
sys.exit(cli.main())
'''


@dataclass
class Sandbox:
    """Where the samples run: the host, its key, the environment and the working directory."""

    host: Proc
    key: str
    cwd: Path
    store: Path
    env: dict[str, str]

    def shell(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", adapt_shell(code, self.host.url)],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", adapt_python(code, self.host.url, self.key)],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )

    def run(self, block: Block) -> subprocess.CompletedProcess[str]:
        if block.lang in SHELL:
            return self.shell(block.code)
        assert block.lang in PYTHON, block
        return self.python(block.code)


DEV_KEY = re.compile(r"Authorization: Bearer (\S+)")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> Iterator[Sandbox]:
    """``loghost serve --dev`` on ./data/loghost of a fresh directory, and the samples' env."""
    import boto3

    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(
        Bucket="bucket"
    )
    cwd = tmp_path_factory.mktemp("samples")
    store = cwd / "data" / "loghost"
    host = spawn_server(
        str(store), cwd, server_id="doc-samples", api_keys=None, extra_args=["--dev"]
    )
    try:
        found = DEV_KEY.search(host.log.read_text())
        assert found is not None, f"serve --dev printed no key: {host.log.read_text()[-2000:]}"
        key = found.group(1)
        bin_dir = cwd / "bin"
        bin_dir.mkdir()
        real_curl = shutil.which("curl")
        assert real_curl is not None, "curl is not installed"
        for name, text in (
            ("curl", CURL.format(curl=real_curl)),
            ("compactor", COMPACTOR.format(python=sys.executable)),
            *((tool, OFF_LIMITS) for tool in CLUSTER_TOOLS),
        ):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOGHOST_", "COMPACTOR_"))}
        env.update(
            {
                "PATH": os.pathsep.join(
                    [str(bin_dir), str(Path(sys.executable).parent), env["PATH"]]
                ),
                "PYTHONPATH": str(REPO),
                "AWS_ENDPOINT_URL": moto_endpoint,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_REGION": "us-east-1",
                **{f"__DOC_{name}": key for name in KEY_NAMES},
                "SERVICE_KEY": key,  # an operator's service key, as the runbooks assume
            }
        )
        env.pop("AWS_PROFILE", None)
        yield Sandbox(host, key, cwd, store, env)
    finally:
        host.terminate()


# ------------------------------------------------------------------------------------------------
# What a sample assumes has happened before it, by block id.


def removed_host_left_a_dirty_log(sb: Sandbox) -> None:
    """A host ``loghost-4`` appended to a log on the store and is gone (a scale-in)."""
    gone = spawn_server(str(sb.store), sb.cwd, server_id="loghost-4", api_keys=KEYS)
    try:
        r = httpx.post(
            f"{gone.url}/v1/tenants/acme/logs/{CID}/records",
            headers=auth(),
            json={"records": [{"id": "a", "op": "add", "document": "left behind"}]},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    finally:
        assert gone.terminate() == 0


QUICK_START = "README.md § Quick start § KEY=...   # the key it printed"


def quick_start_ran(sb: Sandbox) -> None:
    """The README's quick start appended to its log (when a test runs alone, too)."""
    (block,) = [b for b in BLOCKS if b.id == QUICK_START]
    r = sb.run(block)
    assert r.returncode == 0, report(block, r)


PRECONDITIONS: dict[str, Callable[[Sandbox], None]] = {
    "README.md § Configuration § loghost scrub ./data/loghost > report.jsonl   "
    "# one JSON line per log; exits 1 on any problem": quick_start_ran,
    "docs/OPERATIONS.md § Recovery: you already scaled in without draining § "
    'curl -s -X POST -H "Authorization: Bearer $SERVICE_KEY" \\': removed_host_left_a_dirty_log,
}


def report(block: Block | str, r: subprocess.CompletedProcess[str]) -> str:
    return f"{block} exited {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


# ------------------------------------------------------------------------------------------------
# The samples.


def unclassified(blocks: list[Block]) -> list[Block]:
    """Blocks that neither run (a shell or Python block) nor are listed with a reason."""
    return [b for b in blocks if b.id not in NOT_RUNNABLE and b.lang not in SHELL | PYTHON]


def test_every_sample_is_run_or_listed() -> None:
    ids = [b.id for b in BLOCKS]
    assert len(ids) == len(set(ids)), "two blocks share an id (file, heading, first line)"
    new = unclassified(BLOCKS)
    assert not new, (
        "blocks that neither run (sh or python) nor are listed in NOT_RUNNABLE with a reason:\n"
        + "\n".join(f"{b}: id {b.id!r}" for b in new)
    )
    stale = sorted((set(NOT_RUNNABLE) | set(PRECONDITIONS)) - set(ids))
    assert not stale, f"NOT_RUNNABLE or PRECONDITIONS name blocks no doc has any more: {stale}"
    assert {b.doc for b in RUNNABLE} == set(DOCS) - {"helm/loghost/README.md"}, (
        "a doc's runnable samples all disappeared: were they listed by mistake?"
    )


def test_listed_blocks_that_are_data_parse() -> None:
    """The listed YAML and INI blocks are at least well-formed."""
    import configparser

    for b in BLOCKS:
        if b.id not in NOT_RUNNABLE:
            continue
        if b.lang == "yaml":
            assert isinstance(yaml.safe_load(b.code), dict), b
        elif b.lang == "ini":
            configparser.ConfigParser().read_string(b.code)


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.doc}:{b.line}" for b in RUNNABLE])
def test_sample_runs(sandbox: Sandbox, block: Block) -> None:
    if block.id in PRECONDITIONS:
        PRECONDITIONS[block.id](sandbox)
    r = sandbox.run(block)
    assert r.returncode == 0, report(block, r)


# ------------------------------------------------------------------------------------------------
# The test can fail: the samples as they were broken, and new blocks nobody reviewed.

BROKEN_CLIENT = """
import asyncio
from compactor_client import LogHostClient, Record

async def main() -> None:
    async with LogHostClient("http://127.0.0.1:8080", "my-api-key", timeout=10) as host:
        await host.append("acme", "c-42", [Record(id="doc-1", op="upsert", document="hello")])

asyncio.run(main())
"""

PAST_THE_TAIL = """
import asyncio
from compactor_client import LogHostClient, Record

LOG = "5a0c3e2d-1b4f-4c6a-8d7e-9f0a1b2c3d4e"

async def main() -> None:
    async with LogHostClient("http://127.0.0.1:8080", "my-api-key", timeout=10) as host:
        await host.append("acme", LOG, [Record(id="doc-1", op="upsert", document="hello")])
        cur = await host.put_cursor("acme", LOG, "my_reader", 1, witness=None)
        await host.put_cursor("acme", LOG, "my_reader", 10, witness=cur.witness)

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("lang", "code", "message"),
    [
        ("python", BROKEN_CLIENT, "not a UUID: 'c-42'"),
        ("python", PAST_THE_TAIL, "past the log's tail"),
        (
            "sh",
            "compactor run --hosts http://h1:8080,http://h2:8080 --store s3://bucket/prefix \\\n"
            "    --member-id c1 --members c1,c2 --once\n",
            "missing --api-key",
        ),
        (
            "sh",
            "export COMPACTOR_API_KEY=not-a-key\n"
            "compactor run --hosts http://h1:8080 --store s3://bucket/prefix --once\n",
            "give a service key (key=*)",
        ),
        (
            "sh",
            "compactor run --hosts http://h1:8080 --store s3://bucket/prefix --once "
            "[--min-records N]\n",
            "unrecognized arguments",
        ),
        (
            "sh",
            'curl -s -H "Authorization: Bearer wrong" "http://127.0.0.1:8080/v1/tenants/dev/logs/'
            '00000000-0000-4000-8000-000000000001/records?from=1"\n',
            "unauthorized",
        ),
        ("sh", "loghost dirty-logs ./data/mistyped\n", "loghost: error:"),
        ("sh", "kubectl -n logs get pods\n", "kubectl: not available to doc samples"),
    ],
    ids=[
        "not-a-uuid",
        "cursor-past-tail",
        "no-api-key",
        "wrong-key",
        "synopsis",
        "curl-401",
        "mistyped-store",
        "kubectl",
    ],
)
def test_a_broken_sample_fails(sandbox: Sandbox, lang: str, code: str, message: str) -> None:
    r = sandbox.run(Block("broken.md", "Broken", lang, code, 1))
    assert r.returncode != 0, report("the broken sample", r)
    assert message in r.stdout + r.stderr, report("the broken sample", r)


def test_an_unknown_placeholder_fails(sandbox: Sandbox) -> None:
    with pytest.raises(AssertionError, match="placeholder TOKEN"):
        sandbox.shell("TOKEN=...\ncurl -s http://127.0.0.1:8080/healthz\n")


def test_a_new_block_must_be_reviewed() -> None:
    new = extract(
        "new.md",
        "# Title\n\n## Deploy\n\n```yaml\nhost: {replicas: 3}\n```\n\n- step:\n\n"
        "   ```sh\n   # not a heading\n   helm upgrade x\n   ```\n",
    )
    assert [(b.heading, b.lang, b.first_line) for b in new] == [
        ("Deploy", "yaml", "host: {replicas: 3}"),
        ("Deploy", "sh", "# not a heading"),
    ]
    assert unclassified(new) == [new[0]]  # data: unreviewed until listed
    assert runnable(new[1])  # a shell block runs (and fails without a cluster) until listed
    assert not runnable(
        Block("docs/OPERATIONS.md", "Uninstall", "sh", "helm uninstall loghost -n logs\n", 1)
    )
