"""A multipart/form-data body that was read whole (body_limit.read_body, held to the request
limit and the memory budget), split into its parts without touching the event loop or the
disk: the part count and each part's size are bounded as the parser goes."""

from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from service.errors import BadRequest


@dataclass
class Part:
    """One part of the form: its field name, whether it is a file, its bytes."""

    name: str = ""
    is_file: bool = False
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0


def parse_form(body: bytes, content_type: str, max_parts: int,
               max_part_bytes: int) -> dict[str, Part]:  # fmt: skip
    """The parts of `body` by field name; 400 for a malformed form, more than `max_parts`
    parts, a part over `max_part_bytes`, or a field given twice."""
    _media, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise BadRequest("the multipart/form-data body has no boundary in its Content-Type")
    parts: list[Part] = []
    header: list[bytes] = [b"", b""]  # the header field and value being read
    headers: dict[bytes, bytes] = {}

    def on_part_begin() -> None:
        if len(parts) >= max_parts:
            raise BadRequest(f"the form has more than {max_parts} parts")
        parts.append(Part())
        headers.clear()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header[0] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header[1] += data[start:end]

    def on_header_end() -> None:
        headers[header[0].lower()] = header[1]
        header[0] = header[1] = b""

    def on_headers_finished() -> None:
        _disposition, found = parse_options_header(headers.get(b"content-disposition", b""))
        part = parts[-1]
        part.name = found.get(b"name", b"").decode("utf-8", "replace")
        part.is_file = b"filename" in found

    def on_part_data(data: bytes, start: int, end: int) -> None:
        part = parts[-1]
        part.size += end - start
        if part.size > max_part_bytes:
            raise BadRequest(f"form part {part.name[:100]!r} is over {max_part_bytes} bytes")
        part.chunks.append(data[start:end])

    callbacks = {"on_part_begin": on_part_begin, "on_header_field": on_header_field,
                 "on_header_value": on_header_value, "on_header_end": on_header_end,
                 "on_headers_finished": on_headers_finished, "on_part_data": on_part_data}  # fmt: skip
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    try:
        parser.write(body)
        parser.finalize()
    except MultipartParseError as exc:
        raise BadRequest(f"the multipart/form-data body is malformed: {exc}") from None
    found: dict[str, Part] = {}
    for part in parts:
        if part.name in found:
            raise BadRequest(f"form field {part.name[:100]!r} is given twice")
        found[part.name] = part
    return found


def part_bytes(part: Part) -> bytes:
    """The bytes of a part (joined once)."""
    return part.chunks[0] if len(part.chunks) == 1 else b"".join(part.chunks)
