"""A real log host process over a seeded ``FaultyStore`` (for the soak and process scenarios).

``python -m verify.reliability.host --store DIR --listen 127.0.0.1:PORT --server-id ID
[--seed S] [--latency-s X] [--jitter-s X] [--error-rate P] [--lost-response-rate P]
[--precondition-storm-rate P]``

It is ``loghost serve`` (the same ``Server`` and FastAPI app under uvicorn, every other setting
from ``LOGHOST_*``) with the store wrapped in a ``FaultyStore``, plus two harness-only routes on the
loopback listener: ``GET /_verify/faults`` (the FaultyStore's stats) and ``POST
/_verify/faults/{enable,disable}``.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verify.reliability.host")
    p.add_argument("--store", required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--server-id", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--latency-s", type=float, default=0.0)
    p.add_argument("--jitter-s", type=float, default=0.0)
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--lost-response-rate", type=float, default=0.0)
    p.add_argument("--precondition-storm-rate", type=float, default=0.0)
    args = p.parse_args(argv)
    if not args.listen.startswith("127.0.0.1:"):
        print("the harness host listens on 127.0.0.1 only", file=sys.stderr)
        return 2

    import uvicorn
    from starlette.responses import JSONResponse

    from host import jsonlog
    from host.api import create_app, uvicorn_config
    from host.config import Settings
    from host.server import Server
    from wal3 import FaultyStore, LocalStore

    settings = Settings(store=args.store, listen=args.listen, server_id=args.server_id)
    jsonlog.configure(settings.log_level)
    faulty = FaultyStore(
        LocalStore(args.store),
        seed=args.seed,
        latency_s=args.latency_s,
        jitter_s=args.jitter_s,
        error_rate=args.error_rate,
        lost_response_rate=args.lost_response_rate,
        precondition_storm_rate=args.precondition_storm_rate,
    )
    app = create_app(Server(settings, store=faulty))

    @app.get("/_verify/faults", include_in_schema=False)
    async def faults() -> JSONResponse:
        return JSONResponse(faulty.stats())

    @app.post("/_verify/faults/{action}", include_in_schema=False)
    async def toggle(action: str) -> JSONResponse:
        if action == "disable":
            faulty.disable()
        elif action == "enable":
            faulty.enable()
        else:
            return JSONResponse({"error": {"code": "not_found", "message": action}}, 404)
        return JSONResponse(faulty.stats())

    uvicorn.Server(uvicorn_config(app, settings, timeout_graceful_shutdown=10)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
