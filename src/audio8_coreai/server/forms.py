"""The multipart form of ``POST /v1/voices``, read as starlette reads it but strictly: a field that is not text in
the form's charset (UTF-8 unless its Content-Type names another) is refused, not read as Latin-1 (starlette's
fallback), which would store mojibake as a voice's transcript and condition every clone of that voice on it."""

from __future__ import annotations

from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request


class FieldNotText(MultiPartException):
    """A form field (``field``, its name) whose bytes are not text in the form's ``charset``."""

    def __init__(self, field: str, charset: str):
        super().__init__(f"the form field {field!r} is not {charset.upper()} text")
        self.field, self.charset = field, charset.upper()


class _StrictParser(MultiPartParser):
    """starlette's multipart parser, raising FieldNotText where it would decode a field as Latin-1."""

    def on_part_end(self) -> None:
        part = self._current_part  # starlette's part as read: its bytes before its own (lenient) decoding
        if part.file is None:
            try:
                part.data.decode(self._charset)
            except UnicodeDecodeError:
                raise FieldNotText(part.field_name, self._charset) from None
        super().on_part_end()


async def read_form(request: Request, max_part_size: int) -> FormData:
    """The form of ``request`` (a field at most ``max_part_size`` bytes): multipart/form-data read strictly, any
    other body as starlette reads it (a urlencoded form; none for another type). Raises MultiPartException (a
    FieldNotText among them) for a form that cannot be read, OSError when its files cannot be spooled. The caller
    closes the form (its files)."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() == "multipart/form-data":
        return await _StrictParser(request.headers, request.stream(), max_part_size=max_part_size).parse()
    return await request.form(max_part_size=max_part_size)
