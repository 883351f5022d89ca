"""The key list's and the Authorization header's exact contract (mutants that survived
`make mutation` on host/auth.py: comment and empty entries, bounds, padding, messages)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from host.auth import Authenticator, parse_keys, read_keys_file
from host.errors import ApiError


def test_comments_blank_entries_and_padding() -> None:
    keys = parse_keys("  # a comment, indented\nk1=acme,,k2=*\n\nYWJjZA===globex:read\n")
    assert keys == {"k1": "acme", "k2": "*", "YWJjZA==": "globex:read"}


def test_key_length_bound_and_messages_name_their_source(tmp_path: Path) -> None:
    assert parse_keys("k" * 512 + "=acme") == {"k" * 512: "acme"}
    with pytest.raises(ValueError, match=r"^LOGHOST_API_KEYS: a key is at most 512"):
        parse_keys("k" * 513 + "=acme")
    with pytest.raises(ValueError, match=r"^LOGHOST_API_KEYS: entries are key=tenant"):
        parse_keys("lonely")
    with pytest.raises(ValueError, match=r"^LOGHOST_API_KEYS: one key is listed with two"):
        parse_keys("k=acme,k=globex")
    with pytest.raises(ValueError, match=r"^LOGHOST_API_KEYS: API key entry: 'a b'"):
        parse_keys("k=a b")
    f = tmp_path / "keys"
    f.write_text("k=bad tenant\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^API keys file {f}: "):
        read_keys_file(f)


def _status(auth: Authenticator, header: str | None) -> str:
    try:
        auth.authenticate(header)
    except ApiError as e:
        return str(e)
    return "ok"


def test_the_authorization_header() -> None:
    long = "k" * 512
    auth = Authenticator({"good": "acme", long: "*"})
    assert _status(auth, None) == "missing Authorization: Bearer <key>"
    assert _status(auth, "Bearer ") == "malformed Authorization header; expected Bearer <key>"
    assert _status(auth, "Basic good") == "malformed Authorization header; expected Bearer <key>"
    assert _status(auth, "Bearer " + "k" * 513) == (
        "malformed Authorization header; expected Bearer <key>"
    )
    assert _status(auth, "Bearer " + long) == "ok"  # 512 is allowed
    assert _status(auth, "Bearer nope") == "unknown API key"
    assert _status(auth, "bearer   good ") == "ok"
    who = auth.authenticate("Bearer good")
    assert who.key_id == hashlib.sha256(b"good").hexdigest()[:8]


def test_reload_answers_whether_the_file_was_taken(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("k=acme\n", encoding="utf-8")
    auth = Authenticator({}, f)
    assert auth.reload() is True
    f.write_text("k=not valid\n", encoding="utf-8")
    assert auth.reload() is False
    assert auth.authenticate("Bearer k").tenant == "acme"  # the old keys stay
    with pytest.raises(ValueError, match="cannot use the API keys file"):
        Authenticator({}, tmp_path / "missing")


def test_an_empty_keys_file_keeps_the_keys_in_use(tmp_path: Path) -> None:
    """A rewrite caught mid-truncation used to load as 'no keys': every caller locked out."""
    f = tmp_path / "keys"
    f.write_text("svc=*\nk=acme\n", encoding="utf-8")
    auth = Authenticator({}, f)
    f.write_text("", encoding="utf-8")
    assert auth.reload() is False
    assert auth.authenticate("Bearer svc").tenant == "*"


def test_messages_an_operator_reads() -> None:
    import re

    from host.auth import check_cursor_name, check_tenant_name, merge_keys, parse_grant

    with pytest.raises(ApiError) as e:
        check_tenant_name("a b")
    assert str(e.value) == "tenant: must match [A-Za-z0-9_.-]{1,128}"
    long = "x y" + "z" * 100
    with pytest.raises(ApiError) as e:
        check_cursor_name(long)
    assert str(e.value) == f"name: cursor names match [A-Za-z0-9_]{{1,128}}: {long[:64]!r}"
    with pytest.raises(ValueError) as v:
        parse_grant("a b")
    assert str(v.value).endswith("(tenant names match [A-Za-z0-9_.-]{1,128})")
    with pytest.raises(
        ValueError,
        match=re.escape(
            "a key is listed in both LOGHOST_API_KEYS and the keys file with different grants"
        ),
    ):
        merge_keys({"k": "acme"}, {"k": "globex"})


def test_reloading_logs_what_happened(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    assert Authenticator({"k": "acme"}).reload() is True  # no file: nothing to re-read
    f = tmp_path / "keys"
    f.write_text("a=acme\nb=*\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="loghost.auth"):
        auth = Authenticator({}, f)
        f.write_text("", encoding="utf-8")
        auth.reload()
    loaded = [r for r in caplog.records if r.getMessage() == "API keys loaded"]
    assert loaded and getattr(loaded[0], "keys", None) == 2
    failed = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert failed == [
        f"API keys file not loaded, the keys in use stay: API keys file {f}: holds no key"
    ]
