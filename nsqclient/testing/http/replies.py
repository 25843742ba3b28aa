"""The replies of nsq's HTTP APIs (``internal/http_api``), shared by the embedded nsqd and
nsqlookupds: RespondV1's 200 and error replies and their headers."""

from __future__ import annotations

from typing import Any

from ..gostyle.text import go_json
from .server import Response

__all__ = ["JSON_CONTENT_TYPE", "NSQ_V1", "v1_response", "v1_error"]

#: Content-Type of every JSON reply.
JSON_CONTENT_TYPE = "application/json; charset=utf-8"
#: Value of the ``X-Nsq-Content-Type`` header on every API reply but ``/ping``.
NSQ_V1 = "nsq; version=1.0"


def v1_response(data: Any = None) -> Response:
    """nsqd's RespondV1 for a 200."""
    headers = {"X-Nsq-Content-Type": NSQ_V1}
    if data is None:
        body = b""
    elif isinstance(data, bytes):
        body = data
    elif isinstance(data, str):
        body = data.encode("utf-8")
    else:
        headers["Content-Type"] = JSON_CONTENT_TYPE
        body = go_json(data)
    return Response(200, body, headers)


def v1_error(status: int, text: str, extra: dict[str, str] | None = None) -> Response:
    """nsqd's RespondV1 for an error: ``{"message": text}``."""
    headers = {"Content-Type": JSON_CONTENT_TYPE, "X-Nsq-Content-Type": NSQ_V1}
    if extra:
        headers.update(extra)
    return Response(status, go_json({"message": text}), headers)
