"""API keys: the key syntax, tenant matching (a property test), constant-time lookup, and the
keys file that is re-read on change or SIGHUP without a restart."""

from __future__ import annotations

import hmac
import os
import signal
import string
import uuid
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host import auth as auth_module
from host.auth import (
    Authenticator,
    Principal,
    Role,
    is_reserved_cursor,
    parse_grant,
    parse_keys,
)
from host.config import Settings
from host.errors import BadRequest, Forbidden, Unauthorized

from .live import auth, live_server, log_path, record, spawn_server, wait_until

# ------------------------------------------------------------------------------- key syntax


def test_key_syntax_tenant_reader_and_service() -> None:
    keys = parse_keys("ka=acme, kr=acme:read ,ks=*\n# a comment line\nkb=globex")
    assert keys == {"ka": "acme", "kr": "acme:read", "ks": "*", "kb": "globex"}
    assert parse_grant("acme") == Principal("acme", "", Role.TENANT)
    assert parse_grant("acme:read") == Principal("acme", "", Role.READER)
    assert parse_grant("*") == Principal("*", "", Role.SERVICE)


@pytest.mark.parametrize(
    "text",
    [
        "ka",
        "ka=",
        "=acme",
        "ka=acme:write",
        "ka=*:read",
        "ka=ac me",
        "ka=acme:",
        "ka=:read",
        "ka=acme\nka=globex",
        "ka=" + "a" * 129,
        "k" * 513 + "=acme",
        "ka=acme/x",
    ],
)
def test_bad_key_entries_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_keys(text)


def test_settings_merge_the_variable_and_the_file(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("kf=acme:read\n")
    s = Settings(api_keys="ka=acme", api_keys_file=str(f))
    assert s.parsed_api_keys() == {"ka": "acme", "kf": "acme:read"}
    with pytest.raises(ValueError):  # the same key with two grants
        Settings(api_keys="kf=acme", api_keys_file=str(f)).parsed_api_keys()
    with pytest.raises(ValueError):  # a missing file is a configuration error at start
        Settings(api_keys_file=str(tmp_path / "missing")).parsed_api_keys()


# ------------------------------------------------------------------------- tenant matching

_ALPHABET = string.ascii_letters + string.digits + "_.-"
names = st.text(_ALPHABET, min_size=1, max_size=12)


@st.composite
def near_names(draw: st.DrawFn) -> tuple[str, str]:
    """A tenant and another valid name close to it: a prefix, an extension, another case, a
    dotted child, or an unrelated name."""
    a = draw(names)
    kind = draw(st.sampled_from(["prefix", "extend", "case", "dotted", "other"]))
    if kind == "prefix" and len(a) > 1:
        b = a[: draw(st.integers(1, len(a) - 1))]
    elif kind == "extend":
        b = a + draw(names)
    elif kind == "case":
        b = "".join(c.swapcase() if draw(st.booleans()) else c for c in a)
    elif kind == "dotted":
        b = a + "." + draw(names)
    else:
        b = draw(names)
    return a, b


@settings(max_examples=400, deadline=None)
@given(near_names(), st.sampled_from([Role.READER, Role.TENANT]))
def test_a_tenant_key_acts_for_exactly_its_tenant(pair: tuple[str, str], role: Role) -> None:
    """The key of ``alice`` never acts for ``al``, ``Alice`` or ``alice.x`` (a surviving mutant
    once authorized by prefix), and always for ``alice`` itself."""
    a, b = pair
    grant = a if role is Role.TENANT else a + ":read"
    who = Authenticator({"the-key": grant}).authenticate("Bearer the-key")
    Authenticator.authorize(who, a, Role.READER)  # its own tenant: allowed
    if b != a:
        with pytest.raises(Forbidden):
            Authenticator.authorize(who, b, Role.READER)
        with pytest.raises(Forbidden):
            Authenticator.authorize_cursor_write(who, b, "mine")


@pytest.mark.parametrize(
    "path_tenant",
    ["al", "Alice", "ALICE", "alice.x", "alice.", "alic", "alice_", "alice-", "xalice", ".alice"],
)
async def test_near_names_are_refused_over_http(tmp_path: Path, path_tenant: str) -> None:
    async with live_server(str(tmp_path / "store")) as lv, lv.client("alice-key") as c:
        path = log_path(path_tenant, uuid.uuid4())
        r = await c.post(path + "/records", json={"records": [record("x")]})
        assert r.status_code == 403, r.text
        assert (await c.get(path)).status_code == 403
        async with lv.client() as svc:  # nothing was created under the near name
            assert (await svc.get(path)).status_code == 404


@pytest.mark.parametrize(
    ("tenant", "status"),
    [
        ("alice%0A", 400),
        ("alice%0D%0A", 400),
        ("alice%00", 400),
        ("alice%20", 400),
        ("%61lice", 200),
        ("al%2Fice", 404),
        ("al/ice", 404),
    ],
)
async def test_encoded_tenant_names(tmp_path: Path, tenant: str, status: int) -> None:
    """Path parameters arrive percent-decoded: ``alice%0A`` is "alice\\n", which must not pass as
    a name (``$`` in a regex matches before a final newline), for a tenant key or for the
    service key (which would make a second "alice"); ``%61lice`` is alice herself."""
    async with live_server(str(tmp_path / "store")) as lv:
        for key in ("alice-key", "svc-key"):
            async with lv.client(key) as c:
                path = f"/v1/tenants/{tenant}/logs/{uuid.uuid4()}/records"
                r = await c.post(path, json={"records": [record("x")]})
                assert r.status_code == status, (key, tenant, r.text)
    with pytest.raises(BadRequest):
        auth_module.check_tenant_name("alice\n")


def test_reserved_cursor_names_ignore_case() -> None:
    for name in (
        "compaction",
        "Compaction",
        "COMPACTION",
        "stable_prefix",
        "_x",
        "loghost_y",
        "LogHost",
    ):
        assert is_reserved_cursor(name), name
    for name in ("mine", "compactions_seen", "reader_1", "x_compaction"):
        assert not is_reserved_cursor(name), name


# ---------------------------------------------------------------------------- constant time


def test_every_key_is_compared_whatever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: the lookup does the same work for the first key, the last, or none."""
    keys = {f"key-{i}": f"t{i}" for i in range(20)}
    a = Authenticator(keys)
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(x: bytes, y: bytes) -> bool:
        calls.append(1)
        return real(x, y)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", counting)
    for key in ("key-0", "key-19", "not-a-key"):
        calls.clear()
        try:
            a.authenticate(f"Bearer {key}")
        except Unauthorized:
            assert key == "not-a-key"
        assert len(calls) == len(keys), key


# ------------------------------------------------------------------------------- keys file


def write_atomically(path: Path, text: str) -> None:
    """As kubelet updates a Secret: a new file renamed into place."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


async def test_the_keys_file_is_re_read_when_it_changes(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("first-key=acme\nsvc-file-key=*\n")
    async with live_server(str(tmp_path / "store"), api_keys="", api_keys_file=str(keys)) as lv:
        path = log_path("acme", uuid.uuid4())
        async with httpx.AsyncClient(base_url=lv.url, trust_env=False) as c:

            async def status(key: str) -> int:
                r = await c.post(
                    path + "/records", headers=auth(key), json={"records": [record("x")]}
                )
                return r.status_code

            assert await status("first-key") == 200
            assert await status("second-key") == 401
            write_atomically(keys, "second-key=acme\nsvc-file-key=*\n")
            assert await status("second-key") == 200  # the next request sees the new file
            assert await status("first-key") == 401
            # a broken file leaves the keys in use
            write_atomically(keys, "this is not a key file")
            assert await status("second-key") == 200
            # a file that is gone, too
            keys.unlink()
            assert await status("second-key") == 200
            write_atomically(keys, "third-key=acme:read\n")
            assert await status("third-key") == 403  # a read-only key may not append
            assert await status("second-key") == 401


def _overwrite_in_place(path: Path, text: str) -> None:
    """Write ``text`` over the start of ``path`` (same inode; the same size when as long)."""
    with open(path, "r+") as f:
        f.write(text)


async def test_reload_reads_the_file_even_when_it_looks_unchanged(tmp_path: Path) -> None:
    """What SIGHUP calls: the file is read again even if its size and times did not change."""
    keys = tmp_path / "keys"
    keys.write_text("aaaa-key=acme\n")
    a = Authenticator({}, keys)
    st0 = keys.stat()
    _overwrite_in_place(keys, "bbbb-key=acme\n")  # same inode, same size, times put back
    os.utime(keys, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    if (keys.stat().st_ino, keys.stat().st_size, keys.stat().st_mtime_ns) != (
        st0.st_ino,
        st0.st_size,
        st0.st_mtime_ns,
    ):
        pytest.skip("this file system changed the file's signature")
    assert a.authenticate("Bearer aaaa-key").tenant == "acme"  # unchanged as far as stat tells
    assert a.reload() is True
    with pytest.raises(Unauthorized):
        a.authenticate("Bearer aaaa-key")
    assert a.authenticate("Bearer bbbb-key").tenant == "acme"


async def test_sighup_reloads_the_keys_file_in_a_running_server(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("old1-key=acme,svc1-key=*\n")
    st0 = keys.stat()
    proc = spawn_server(
        str(tmp_path / "store"),
        tmp_path,
        api_keys=None,
        extra_env={"LOGHOST_API_KEYS_FILE": str(keys)},
    )
    try:
        path = log_path("acme", uuid.uuid4())
        async with httpx.AsyncClient(base_url=proc.url, trust_env=False) as c:

            async def status(key: str) -> int:
                return (await c.get(path, headers=auth(key))).status_code

            assert await status("old1-key") == 404  # known key, never-written log
            # rewritten in place with the same size and times: only SIGHUP can tell
            _overwrite_in_place(keys, "new1-key=acme,svc1-key=*\n")
            os.utime(keys, ns=(st0.st_atime_ns, st0.st_mtime_ns))
            assert await status("new1-key") == 401
            proc.proc.send_signal(signal.SIGHUP)

            async def reloaded() -> bool:
                return await status("new1-key") == 404

            await wait_until(reloaded, "the keys file re-read after SIGHUP")
            assert await status("old1-key") == 401
            assert proc.proc.poll() is None, "SIGHUP ended the server"
    finally:
        proc.terminate()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.text(_ALPHABET, min_size=1, max_size=20), names, st.sampled_from(["", ":read"])
        ),
        min_size=1,
        max_size=8,
        unique_by=lambda t: t[0],
    )
)
def test_every_listed_key_authenticates_as_its_grant(entries: list[tuple[str, str, str]]) -> None:
    text = ",".join(f"{k}={t}{r}" for k, t, r in entries)
    a = Authenticator(parse_keys(text))
    for k, t, r in entries:
        who = a.authenticate(f"Bearer {k}")
        assert who.tenant == t and who.role == (Role.READER if r else Role.TENANT)
