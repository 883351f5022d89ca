"""``/docs`` and ``/redoc`` render with no internet: every asset a page references is served by
the log host itself, and nothing points at another host."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from .live import live_server

# URLs in the inline script that boots the page (Swagger UI's ``url``/``oauth2RedirectUrl``,
# ReDoc's ``spec-url`` attribute is caught by the parser).
_SCRIPT_URL = re.compile(r"""(?:url|oauth2RedirectUrl)['"]?\s*:\s*['"]([^'"]+)['"]""")


class _Refs(HTMLParser):
    """Every URL an HTML page loads or links: src, href and spec-url attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_script = tag == "script"
        for name, value in attrs:
            if name in ("src", "href", "spec-url") and value:
                self.urls.append(value)

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


def references(html: str) -> list[str]:
    parser = _Refs()
    parser.feed(html)
    found = list(parser.urls)
    for script in parser.scripts:
        found += _SCRIPT_URL.findall(script)
    return found


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_pages_load_everything_from_the_server_itself(tmp_path: Path, page: str) -> None:
    async with (
        live_server(str(tmp_path / "store")) as lv,
        httpx.AsyncClient(base_url=lv.url, trust_env=False) as c,
    ):
        r = await c.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
        assert not re.search(r"(?:https?:)?//[A-Za-z0-9]", r.text), (
            "the page names another host",
            re.findall(r"(?:https?:)?//[^\s'\"]+", r.text),
        )
        refs = references(r.text)
        kinds = {urlsplit(u).path.rsplit(".", 1)[-1] for u in refs}
        assert {"js", "json"} <= kinds, refs  # the script and the API description at least
        if page == "/docs":
            assert "css" in kinds, refs
        for ref in refs:
            url = urljoin(lv.url + page, ref)
            assert urlsplit(url).netloc == urlsplit(lv.url).netloc, ref
            asset = await c.get(url)
            assert asset.status_code == 200, (ref, asset.status_code)
            assert asset.content, ref
            if ref.endswith(".css"):  # stylesheets pull nothing from elsewhere either
                assert not re.search(r"url\(\s*['\"]?(?:https?:)?//", asset.text), ref


async def test_swagger_ui_renders_openapi_3_1(tmp_path: Path) -> None:
    """FastAPI describes the API as OpenAPI 3.1, which Swagger UI renders from version 5 on
    (an older bundle shows an error instead of the API)."""
    async with (
        live_server(str(tmp_path / "store")) as lv,
        httpx.AsyncClient(base_url=lv.url, trust_env=False) as c,
    ):
        spec = (await c.get("/openapi.json")).json()
        assert spec["openapi"].startswith("3.1")
        bundle = (await c.get("/docs/assets/swagger-ui-bundle.js")).text
        versions = {int(v) for v in re.findall(r'"(\d+)\.\d+\.\d+"', bundle[:2_000_000])}
        assert 5 in versions, sorted(versions)[:20]


@pytest.mark.parametrize(
    "path",
    [
        "/docs/assets/../core.py",
        "/docs/assets/..%2Fcore.py",
        "/docs/assets/%2e%2e/core.py",
        "/docs/assets/..%2F..%2Fhost%2Fauth.py",
        "/docs/assets/",
        "/docs/assets/missing.js",
    ],
)
async def test_the_assets_directory_serves_nothing_else(tmp_path: Path, path: str) -> None:
    """The static mount is public: it must not hand out files outside the bundled assets."""
    async with live_server(str(tmp_path / "store")) as lv:
        host, port = lv.url.removeprefix("http://").split(":")
        import asyncio

        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await reader.readline()
        writer.close()
        assert int(status_line.split()[1]) == 404, (path, status_line)
