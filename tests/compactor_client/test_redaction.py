"""Secrets never reach the compactor's logs, whoever logs them (a library at DEBUG included)."""

from __future__ import annotations

import io
import logging

from compactor_client.cli import RedactSecrets, secrets_of


def test_every_record_is_redacted_whoever_logs_it() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactSecrets(["s3cr3t-value-1", "AKIDEXAMPLE1", "x"]))
    log = logging.getLogger("some.library")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        log.debug("headers %r", {"Authorization": "Credential=AKIDEXAMPLE1/2026"})
        log.debug("plan %s", b"...\x80\x04s3cr3t-value-1...")
        try:
            raise ValueError("bad secret s3cr3t-value-1")
        except ValueError:
            log.exception("failed")
        log.debug("an x stays an x")  # too short to be a secret: left alone
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    assert "s3cr3t" not in text and "AKIDEXAMPLE1" not in text
    assert text.count("***") == 4 and "an x stays an x" in text


def test_the_secrets_are_the_api_key_and_the_store_credentials() -> None:
    env = {
        "AWS_SECRET_ACCESS_KEY": "sk",
        "AWS_SESSION_TOKEN": "tok",
        "AWS_ACCESS_KEY_ID": "ak",
        "HOME": "/root",
    }
    assert sorted(secrets_of(None, env)) == ["ak", "sk", "tok"]
