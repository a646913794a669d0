"""Refuse request bodies of a media type the route does not take (415).

A browser sends `application/x-www-form-urlencoded`, `multipart/form-data` and `text/plain`
cross-site without asking first (a CORS "simple request"); refusing every type but the
route's own keeps such a post from running anything.

The v1 operator lane checks JSON, the V2 lane V2_TYPES (or none: tritonclient sends none).
"""

from starlette.types import Scope

from service.errors import UnsupportedMediaType

JSON = ("application/json",)
FORM = ("multipart/form-data",)
V2_TYPES = ("application/json", "application/octet-stream")
"""What KServe V2 clients send: JSON, or JSON followed by binary tensors (tritonclient's binary
extension sends `application/octet-stream` or no Content-Type at all)."""


def check_content_type(scope: Scope, accepted: tuple[str, ...], missing_ok: bool = False) -> None:
    """Refuse (415) a Content-Type whose media type (parameters aside) is not in `accepted`,
    or a missing one unless `missing_ok`; the message names what is accepted."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower().decode("latin-1")
            if media in accepted:
                return
            raise UnsupportedMediaType(
                f"Content-Type {media[:60]!r} is not accepted here; send {_either(accepted)}"
            )
    if not missing_ok:
        raise UnsupportedMediaType(f"the request has no Content-Type; send {_either(accepted)}")


def _either(accepted: tuple[str, ...]) -> str:
    return " or ".join(accepted)
