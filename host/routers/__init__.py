"""The REST API's routes, one module per resource; each handler reads its request and calls a
service (``host.services``).  ``host.api.create_app`` assembles them."""

from __future__ import annotations

from typing import Any

from ..models import ErrorResponse

LOG_PATH = "/tenants/{tenant}/logs/{collection_id}"
"""A log's path under ``/v1``."""

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (307, 400, 401, 403, 404, 409, 410, 413, 429, 503)
}
"""The error answers every ``/v1`` route documents."""
