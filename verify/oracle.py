"""Reference semantics, written independently of the product, that checks compare against."""

from __future__ import annotations

from typing import Any


def reference_fold(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The compacted state of a collection after ``records`` (add, upsert, update, delete).

    Written from the record semantics in the README, not from ``compactor_client.fold``, so a
    bug there cannot hide in both.
    """
    rows: dict[str, dict[str, Any]] = {}
    for r in records:
        rid, op = r["id"], r["op"]
        if op == "delete":
            rows.pop(rid, None)
            continue
        md = r.get("metadata") or {}
        if rid not in rows:
            if op in ("add", "upsert"):
                rows[rid] = {
                    "document": r.get("document"),
                    "embedding": r.get("embedding"),
                    "metadata": {k: v for k, v in md.items() if v is not None},
                }
            continue
        if op == "add":
            continue
        row = rows[rid]
        if r.get("document") is not None:
            row["document"] = r["document"]
        if r.get("embedding") is not None:
            row["embedding"] = r["embedding"]
        for k, v in md.items():
            if v is None:
                row["metadata"].pop(k, None)
            else:
                row["metadata"][k] = v
    return rows
