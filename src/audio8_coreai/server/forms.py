"""The multipart form of ``POST /v1/voices``, read as starlette reads it but strictly: a field that is not text in
the form's charset (UTF-8 unless its Content-Type names another) is refused, not read as Latin-1 (starlette's
fallback), which would store mojibake as a voice's transcript and condition every clone of that voice on it."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.datastructures import FormData
from starlette.formparsers import FormParser, MultiPartException, MultiPartParser
from starlette.requests import Request

FORM_OVERHEAD_BYTES = 65536  # what a form may carry beside its file: its other fields, part heads and boundaries


class FieldNotText(MultiPartException):
    """A form field (``field``, its name) whose bytes are not text in the form's ``charset``."""

    def __init__(self, field: str, charset: str):
        super().__init__(f"the form field {field!r} is not {charset.upper()} text")
        self.field, self.charset = field, charset.upper()


class FormTooLarge(MultiPartException):
    """A form's body past its limit (``limit``, bytes), found as it is read: nothing past it was read or spooled."""

    def __init__(self, limit: int):
        super().__init__(f"the form is over {limit} bytes")
        self.limit = limit


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


async def read_form(request: Request, max_file_bytes: int) -> FormData:
    """The form of ``request``, its body read up to ``max_file_bytes`` + FORM_OVERHEAD_BYTES (chunked or not, so a
    client cannot fill the server's disk or memory): multipart/form-data read strictly, a urlencoded form as
    starlette reads it, no form for another type. Raises FormTooLarge past the bound, MultiPartException (a
    FieldNotText among them) for a form that cannot be read, OSError when its files cannot be spooled. The caller
    closes the form (its files)."""
    body = _bounded(request.stream(), max_file_bytes + FORM_OVERHEAD_BYTES)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        return await _StrictParser(request.headers, body, max_part_size=max_file_bytes).parse()
    if kind == "application/x-www-form-urlencoded":  # fields only (a clip comes as a file): what is missing is told
        return await FormParser(request.headers, body).parse()
    return FormData()


async def _bounded(body: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """``body``'s chunks, raising FormTooLarge once they pass ``limit`` bytes in all."""
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size > limit:
            raise FormTooLarge(limit)
        yield chunk
