"""Wyoming events in and out: one event read from a client, bounded in bytes and in time; parsed; a refusal.

The ``wyoming`` package's reader takes whatever a client promises: ``readexactly(data_length)`` for any length, no
idle timeout, and a malformed line ends the connection with a logged traceback. A text-to-speech server takes no
audio in, so here an event may carry at most ``max_bytes`` of data and of payload, the client must send each part
within ``idle_s``, and anything else is a :class:`..errors.ProtocolError` that says what was wrong (the handler
answers it with an ``error`` event and closes).

The wire format (one JSON line with ``type``, optional ``data``, ``data_length`` and ``payload_length``, then that
many bytes of JSON data and of payload) is the package's; the result is its :class:`wyoming.event.Event`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TypeVar

from wyoming.error import Error
from wyoming.event import Event

from ..errors import AssetError, Audio8Error, DamagedVoice, NoAudio, ProtocolError
from .errors import ASSET_FAULT

log = logging.getLogger(__name__)
T = TypeVar("T")


async def _within(idle_s: float, step, what: str):
    """``await step`` or ProtocolError when the client sends nothing for ``idle_s`` seconds."""
    try:
        return await asyncio.wait_for(step, idle_s)
    except TimeoutError:
        raise ProtocolError(f"no {what} from the client in {idle_s:g} s: the connection is closed") from None


async def _line(reader: asyncio.StreamReader) -> bytes:
    """The next line (b"" at the end); ProtocolError for one longer than the stream's buffer (asyncio's limit,
    64 KiB), which never ends within it."""
    try:
        return await reader.readline()
    except ValueError:
        raise ProtocolError("an event line too long to read: each event is one short line of JSON") from None


def _length(header: dict, key: str, max_bytes: int) -> int:
    """The header's ``key`` (bytes to follow), 0 when absent; ProtocolError unless a whole number up to
    ``max_bytes``."""
    n = header.get(key)
    if n is None:
        return 0
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ProtocolError(f"an event's {key} must be a whole number of bytes, got {n!r}")
    if n > max_bytes:
        raise ProtocolError(
            f"an event's {key} of {n} bytes is over this server's {max_bytes}: a text-to-speech server takes text "
            "events only (no audio)"
        )
    return n


async def read_event(reader: asyncio.StreamReader, max_bytes: int, idle_s: float) -> Event | None:
    """The next event, or None when the client has closed the connection.

    Raises ProtocolError for a line that is not a JSON object with a string ``type``, a ``data`` or
    ``data_length``/``payload_length`` of the wrong kind, more than ``max_bytes`` of a line, data or payload (the
    bytes past the limit are never read), or a client silent for ``idle_s`` seconds mid-event or between events.
    """
    line = await _within(idle_s, _line(reader), "event")
    if not line:
        return None
    if len(line) > max_bytes:
        raise ProtocolError(f"an event line of {len(line)} bytes is over this server's {max_bytes}")
    try:
        header = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ProtocolError("an event line that is not JSON: each event is one line of a JSON object") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError('an event must be a JSON object with a string "type"')
    data = header.get("data", {})
    if not isinstance(data, dict):
        raise ProtocolError(f"an event's data must be a JSON object, got {type(data).__name__}")
    data_length = _length(header, "data_length", max_bytes)
    payload_length = _length(header, "payload_length", max_bytes)
    try:
        raw = await _within(idle_s, reader.readexactly(data_length), "event data") if data_length else None
        payload = await _within(idle_s, reader.readexactly(payload_length), "event payload") if payload_length else None
    except asyncio.IncompleteReadError:  # the client closed mid-event
        return None
    if raw is not None:
        try:
            more = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ProtocolError("an event's data bytes are not JSON") from None
        if not isinstance(more, dict):
            raise ProtocolError(f"an event's data bytes must be a JSON object, got {type(more).__name__}")
        data = {**data, **more}
    return Event(type=header["type"], data=data, payload=payload)


def parse(event: Event, kind: type[T]) -> T:
    """``kind.from_event(event)``, or ProtocolError naming the event when a field is missing or malformed (a
    ``voice`` that is not an object included: the package would drop it, and the model's own voice would speak)."""
    voice = event.data.get("voice")
    if voice is not None and not isinstance(voice, dict):
        raise ProtocolError(
            f'{event.type}\'s voice must be an object such as {{"name": "ana"}}, '
            f"got {type(voice).__name__} {voice!r:.40}"
        )
    try:
        return kind.from_event(event)
    except KeyError as e:  # a field the event must carry
        raise ProtocolError(f"malformed {event.type} event: it needs its {e} field (the Wyoming protocol)") from None
    except (TypeError, AttributeError, ValueError) as e:
        raise ProtocolError(
            f"malformed {event.type} event ({type(e).__name__}: {e}): see the Wyoming protocol"
        ) from None


def refusal(e: Audio8Error) -> Error:
    """``e`` as the ``error`` event a client gets: its message, the error's class as the code (``no_audio`` for
    :class:`NoAudio`); a damaged stored voice and an asset fault said without the server's path."""
    if isinstance(e, DamagedVoice):
        text = (
            f"the stored voice {e.name!r} is damaged or from a newer version on this server: remove it "
            f"(audio8 voice rm) and add it again"
        )
        return Error(text=text, code="DamagedVoice")
    if isinstance(e, AssetError):  # the server's fault, said without its path (logged there with it)
        log.error("asset fault: %s", e)
        return Error(text=ASSET_FAULT, code="server_error")
    return Error(text=str(e), code="no_audio" if isinstance(e, NoAudio) else type(e).__name__)
