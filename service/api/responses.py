"""JSON responses serialized by orjson (numpy arrays included)."""

from typing import Any

import orjson
from starlette.responses import Response

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def dumps(content: Any) -> bytes:
    """orjson bytes; numpy arrays in `content` are written natively."""
    return orjson.dumps(content, option=_OPTIONS)


class OrjsonResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)
