"""The HTTP ceiling of this stack: a trivial FastAPI app served exactly like ``loghost serve``.

The ceiling is fixed as the stack the log host started on (issue 14): uvicorn with ``--loop
asyncio --http h11``, pinned explicitly (uvicorn's ``auto`` would pick httptools, and uvloop,
whenever they are installed, and a faster stack in the product must count as a gain, not raise
its own bar).  Otherwise as ``host.cli._serve`` (``log_config=None``, ``access_log=False``,
``lifespan="on"``, ``server_header=False``), same route shape as the host's append.  The POST
handler reads the whole body and answers a small JSON object, without parsing, validation, auth
or storage, so ``host / ceiling`` is the share of that fixed stack's capacity the log host reaches.

``python -m bench.http_ceiling --listen 127.0.0.1:PORT [--loop asyncio] [--http h11]``
"""

from __future__ import annotations

import argparse
import sys

import uvicorn
from fastapi import FastAPI, Request
from starlette.responses import Response

# The fixed ceiling stack (issue 14): asyncio's event loop and h11's pure-Python parser.
LOOP = "asyncio"
HTTP = "h11"

app = FastAPI(title="ceiling")


@app.post("/v1/tenants/{tenant}/logs/{collection_id}/records")
async def append(tenant: str, collection_id: str, request: Request) -> Response:
    body = await request.body()
    return Response(
        b'{"first_offset":1,"count":1,"next_offset":%d}' % (len(body) + 1),
        media_type="application/json",
    )


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok", "server_id": "ceiling"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.http_ceiling")
    p.add_argument("--listen", default="127.0.0.1:8090")
    p.add_argument("--loop", default=LOOP, help=f"uvicorn event loop ({LOOP})")
    p.add_argument("--http", default=HTTP, help=f"uvicorn HTTP protocol ({HTTP})")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    config = uvicorn.Config(
        app,
        host=host,
        port=int(port),
        log_config=None,
        access_log=False,
        lifespan="on",
        server_header=False,
        loop=args.loop,
        http=args.http,
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
