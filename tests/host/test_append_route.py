"""The append takes the plain Starlette route (``host.routers.records``), not FastAPI's: the same
answers (the whole suite runs through it), the same description, and the route named in the
scope for the request metrics."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx

from host.api import create_app
from host.config import Settings
from host.server import Server


async def test_appends_take_the_starlette_route_and_keep_their_description(tmp_path: Path) -> None:
    server = Server(Settings(store=str(tmp_path / "store"), api_keys="k=alice,s=*"))
    app = create_app(server)
    served: list[Any] = []

    async def spy(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)
        if scope["type"] == "http":
            served.append((scope["method"], scope.get("endpoint"), scope.get("route")))

    path = f"/v1/tenants/alice/logs/{uuid.uuid4()}/records"
    await server.start()
    try:
        transport = httpx.ASGITransport(app=spy)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            ok = await c.post(
                path,
                json={"records": [{"id": "a", "op": "add"}]},
                headers={"authorization": "Bearer k"},
            )
            assert ok.status_code == 200 and ok.json() == {
                "first_offset": 1,
                "count": 1,
                "next_offset": 2,
            }, ok.text
            denied = await c.post(path, json={"records": []})  # no key: the same 401 as ever
            assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"
            read = await c.get(path, headers={"authorization": "Bearer k"})
            assert read.status_code == 200
            doc = (await c.get("/openapi.json")).json()
    finally:
        await server.close()
    (m1, e1, r1), (m2, e2, _), (m3, e3, r3) = served[:3]
    assert (m1, e1.__name__, r1.path) == ("POST", "append_fast", "/v1" + LOG_PATH + "/records")
    assert (m2, e2) == ("POST", e1)  # the refusal too
    assert m3 == "GET" and e3.__name__ != "append_fast" and r3.path == r1.path
    op = doc["paths"]["/v1" + LOG_PATH + "/records"]["post"]
    assert op["x-required-key"].startswith("a tenant key")
    assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/AppendRequest"
    )


LOG_PATH = "/tenants/{tenant}/logs/{collection_id}"
