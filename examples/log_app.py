"""A small application on the log host's async client: append, tail, read the compacted state.

It needs only the bare install (``pip install loghost``: the client, with httpx and pydantic)::

    python examples/log_app.py --url http://127.0.0.1:8080 --api-key KEY --tenant acme

1. **Append** a batch of records to a log (a collection id is a UUID; a new one by default), with
   an idempotency key so that the append is safe to retry after a timeout.
2. **Tail** the log from the batch's first offset with long-polling reads (``wait_ms``): the
   reader catches up, then parks in a long poll; a second batch appended meanwhile wakes it.
3. **Read the compacted state**, if a compactor has produced one.  The host reports how far
   compaction has got (``compaction_offset``); the state itself is Parquet in the store, read
   with ``compactor_client.reader`` when ``--store`` names the store and pyarrow is installed
   (``pip install 'loghost[reader]'``).  Records from the state's offset on are still only in the
   log: state plus log tail is the whole collection.

``--json`` prints one JSON summary line at the end (the tests read it).  Exit status: 0, or 1 with
one line on stderr when the host answers an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any

from compactor_client import LogHostClient, Record
from compactor_client.errors import LogHostError


def batch(prefix: str, n: int) -> list[Record]:
    """``n`` documents to upsert."""
    return [
        Record(
            id=f"{prefix}-{i}",
            op="upsert",
            document=f"{prefix} document {i}",
            metadata={"batch": prefix, "n": i},
        )
        for i in range(n)
    ]


async def tail(
    host: LogHostClient,
    tenant: str,
    log: str,
    start: int,
    *,
    until: int,
    caught_up: asyncio.Event,
    wait_ms: int,
) -> list[int]:
    """Read from ``start`` until ``until`` records were seen, long-polling at the tail.

    Sets ``caught_up`` the first time a read reaches the tail known at that point.  A long poll
    that expires with nothing new ends the tail (the writer is done).
    """
    offset, seen = start, list[int]()
    while len(seen) < until:
        page = await host.read(tenant, log, from_offset=offset, limit=100, wait_ms=wait_ms)
        if not page.records:
            break  # nothing arrived within wait_ms
        for r in page.records:
            print(f"  tail: offset {r.offset} {r.record.op} {r.record.id}")
            seen.append(r.offset)
        offset = page.next_offset
        if not caught_up.is_set():
            state = await host.state(tenant, log)
            if offset >= state.next_offset:
                caught_up.set()  # the next read waits in a long poll
    return seen


async def compacted(store: str | None, log: str) -> dict[str, Any]:
    """The compacted state of ``log`` in ``store``, summarised; or why it could not be read."""
    if store is None:
        return {"available": False, "why": "no --store given"}
    try:
        from compactor_client.reader import read_collection  # pyarrow: loghost[reader]
    except ImportError as exc:
        return {"available": False, "why": f"needs pip install 'loghost[reader]' ({exc.name})"}
    state = await asyncio.to_thread(read_collection, store, log)
    if state.version == 0:
        return {"available": False, "why": "not compacted yet"}
    ids = state.table.column("id").to_pylist()
    return {
        "available": True,
        "version": state.version,
        "offset": state.offset,  # the first log offset not in the state
        "rows": state.table.num_rows,
        "ids": ids,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    log = args.collection or str(uuid.uuid4())
    async with LogHostClient(args.url, args.api_key, timeout=10) as host:
        # 1. Append.  A fresh key per batch: re-sending *this* request after a timeout is safe.
        first = await host.append(
            args.tenant, log, batch("early", args.records), idempotency_key=uuid.uuid4().hex
        )
        print(
            f"appended {first.count} records to {log}: offsets {first.first_offset}..{first.next_offset - 1}"
        )

        # 2. Tail with long polls while a writer appends a second batch.
        caught_up = asyncio.Event()

        async def writer() -> tuple[int, float]:
            await caught_up.wait()
            await asyncio.sleep(0.2)  # the reader is parked in its long poll by now
            late = await host.append(
                args.tenant, log, batch("late", args.records), idempotency_key=uuid.uuid4().hex
            )
            print(f"appended {late.count} more records while the reader waits")
            return late.next_offset, time.monotonic()

        reader = asyncio.create_task(
            tail(
                host,
                args.tenant,
                log,
                first.first_offset,
                until=2 * args.records,
                caught_up=caught_up,
                wait_ms=args.wait_ms,
            )
        )
        (late_next, late_at), seen = await asyncio.gather(writer(), reader)
        woke_ms = round((time.monotonic() - late_at) * 1000)
        print(f"tailed {len(seen)} records; the long poll returned the late batch")

        # 3. Compaction: how far it got (from the host), and the state itself (from the store).
        state = await host.state(args.tenant, log)
        print(f"compaction offset {state.compaction_offset}, log tail {state.next_offset}")
        summary = await compacted(args.store, log)
        if summary["available"]:
            print(
                f"compacted state v{summary['version']}: {summary['rows']} documents, "
                f"log records from offset {summary['offset']} are not in it yet"
            )
        else:
            print(f"compacted state: {summary['why']}")
    return {
        "collection_id": log,
        "first_offset": first.first_offset,
        "next_offset": late_next,
        "tailed": seen,
        "woke_after_ms": woke_ms,
        "compaction_offset": state.compaction_offset,
        "compacted": summary,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument(
        "--url", default="http://127.0.0.1:8080", help="a log host (default: %(default)s)"
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("APP_API_KEY"),
        help="a tenant key (default: $APP_API_KEY)",
    )
    p.add_argument("--tenant", default="acme", help="the key's tenant (default: %(default)s)")
    p.add_argument("--collection", help="the log's UUID (default: a new one)")
    p.add_argument("--records", type=int, default=3, help="records per batch (default: 3)")
    p.add_argument("--wait-ms", type=int, default=5000, help="long-poll wait (default: 5000)")
    p.add_argument("--store", help="the host's store (a path or s3://...), to read compacted state")
    p.add_argument("--json", action="store_true", help="print a JSON summary line at the end")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        summary = asyncio.run(run(args))
    except LogHostError as exc:
        print(f"log_app: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
