"""Verification tooling for the wal3 engine (the deterministic simulator lives in ``verify.sim``)."""
