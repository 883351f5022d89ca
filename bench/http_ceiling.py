"""The HTTP ceiling of this stack: a trivial FastAPI app served exactly like ``loghost serve``.

Same uvicorn settings as ``host.cli._serve`` (``log_config=None``, ``access_log=False``,
``lifespan="on"``, ``server_header=False``, uvicorn's default ``loop``/``http`` choice, which is
asyncio + h11 in this virtualenv), same route shape as the host's append.  The POST handler reads
the whole body and answers a small JSON object, without parsing, validation, auth or storage, so
``host / ceiling`` is the share of the HTTP stack's own capacity the log host keeps.

``python -m bench.http_ceiling --listen 127.0.0.1:PORT``
"""

from __future__ import annotations

import argparse
import sys

import uvicorn
from fastapi import FastAPI, Request
from starlette.responses import Response

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
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
