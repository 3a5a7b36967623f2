"""``audio8 wyoming`` against clients that break the protocol: lengths promised past the server's bound, silence
mid-event, lines that are not events, a voice that is not an object. Each gets an ``error`` event saying what was
wrong and the connection closed, one log line and no traceback, and the server serves the next client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import pytest
from wyoming.error import Error
from wyoming.event import Event

from audio8_coreai.settings import WyomingSettings
from tests.server.wyoming_support import serving, talk


async def _raw(port: int, sent: bytes, then: bytes = b"", events: int | None = None) -> tuple[list[dict], float]:
    """Send ``sent`` on a fresh connection, then ``then`` (up to 1 MB, as much as the server takes); read what
    comes back until the server closes (or ``events`` events came). Returns the events received (their header
    with their data) and the seconds until then."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    writer.write(sent)
    if then:
        writer.write(then)
    try:
        await writer.drain()
    except ConnectionError:
        pass  # the server closed before taking it all: what the bound is for
    lines = []
    with contextlib.suppress(ConnectionResetError):  # closed with bytes unread: a reset
        while line := await asyncio.wait_for(reader.readline(), 30):
            header = json.loads(line)
            if header.get("data_length"):
                header["data"] = json.loads(await reader.readexactly(header["data_length"]))
            lines.append(header)
            if len(lines) == events:
                break
    writer.close()
    return lines, time.monotonic() - t0


def _refused(tts, sent: bytes, then: bytes = b"", settings: WyomingSettings | None = None) -> tuple[Error, float]:
    """What one hostile connection gets (its only event must be an error), and that the server serves on."""

    async def main():
        async with serving(tts, settings) as port:
            got = await _raw(port, sent, then)
            after = await _raw(port, b'{"type": "describe"}\n', events=1)
            return got, after

    (lines, seconds), (after, _) = asyncio.run(main())
    assert len(lines) == 1 and lines[0]["type"] == "error", lines
    assert [a["type"] for a in after] == ["info"]  # the next client is served
    return Error.from_event(Event(lines[0]["type"], lines[0].get("data", {}))), seconds


@pytest.mark.parametrize("key", ["payload_length", "data_length"])
def test_a_promised_length_past_the_bound_is_refused_without_reading_it(never_eos_tts, key, caplog):  # noqa: F811
    """An audio chunk promising 10^11 bytes (4 KB of them sent), a synthesize promising as much and sending nothing:
    refused at once, nothing more read."""
    header = json.dumps({"type": "audio-chunk" if key == "payload_length" else "synthesize", key: 10**11}) + "\n"
    with caplog.at_level(logging.WARNING, logger="audio8_coreai.server.wyoming"):
        error, seconds = _refused(never_eos_tts, header.encode(), b"\0" * 4096 if key == "payload_length" else b"")
    bound = WyomingSettings().max_event_bytes  # the served speaker's (test_wyoming.serving)
    assert error.code == "ProtocolError" and f"{key} of 100000000000 bytes is over this server's {bound}" in error.text
    assert seconds < 10
    assert [r.getMessage() for r in caplog.records if "refused" in r.getMessage()] == [
        f"wyoming client refused: {error.text}"
    ]
    assert not any(r.exc_info for r in caplog.records)  # one line, no traceback


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (b"not json\n", "not JSON"),
        (b'{"data": {}}\n', 'a string "type"'),
        (b'["describe"]\n', 'a string "type"'),
        (b'{"type": "synthesize", "data_length": "5"}\n', "data_length must be a whole number of bytes, got '5'"),
        (b'{"type": "synthesize", "data_length": -1}\n', "data_length must be a whole number of bytes, got -1"),
        (b'{"type": "synthesize", "data": "Hi."}\n', "data must be a JSON object, got str"),
        (b'{"type": "synthesize", "data_length": 4}\nHi."\n', "data bytes are not JSON"),
        (b'{"type": "synthesize", "data": {"text": "Hi.", "voice": "ana"}}\n', "voice must be an object"),
        (b"x" * (2**16 + 10) + b"\n", "too long to read"),
    ],
)
def test_a_malformed_event_is_an_error_event(never_eos_tts, line, needle):  # noqa: F811
    error, _ = _refused(never_eos_tts, line)
    assert error.code == "ProtocolError" and needle in error.text, error.text
    assert "Traceback" not in error.text


def test_a_client_silent_mid_event_is_closed(never_eos_tts):  # noqa: F811
    """A synthesize whose 100 promised bytes of data never come: closed after the idle bound, saying so."""
    sent = b'{"type": "synthesize", "data_length": 100}\n'
    error, seconds = _refused(never_eos_tts, sent, settings=WyomingSettings(idle_s=0.5))
    assert "no event data from the client in 0.5 s" in error.text and 0.4 < seconds < 10


def test_an_idle_connection_is_closed(never_eos_tts):  # noqa: F811
    error, seconds = _refused(never_eos_tts, b"", settings=WyomingSettings(idle_s=0.5))
    assert "no event from the client in 0.5 s" in error.text and 0.4 < seconds < 10


def test_a_data_length_within_the_bound_still_speaks(never_eos_tts):  # noqa: F811
    """The split form the package's own client writes (data after the line) is served as before."""
    (received,) = talk(never_eos_tts, [Event("synthesize", {"text": "Hi."}), None])
    assert [e.type for e in received][0] == "audio-start" and received[-1].type == "audio-stop"


def test_a_client_pouring_bytes_after_a_refused_header_is_cut_off(never_eos_tts):  # noqa: F811
    """A megabyte after an audio chunk's header promising 10^11 bytes: the server stops reading at the header and
    closes (a reset, with bytes unread) within seconds; the next client is served."""
    header = json.dumps({"type": "audio-chunk", "payload_length": 10**11}).encode() + b"\n"

    async def main():
        async with serving(never_eos_tts) as port:
            _, seconds = await _raw(port, header, b"\0" * 2**20)
            after, _ = await _raw(port, b'{"type": "describe"}\n', events=1)
            return seconds, after

    seconds, after = asyncio.run(main())
    assert seconds < 10 and [a["type"] for a in after] == ["info"]
