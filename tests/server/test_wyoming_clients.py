"""``audio8 wyoming`` with many clients at once: clients that stop reading, more connections than the server takes,
and the log they leave. A client that reads nothing holds at most ``buffer_s`` of audio and the model not at all
for an utterance shorter than that; it is dropped after ``stall_s``; past ``max_connections`` a client gets a
``busy`` error; their warnings are logged at most ten a minute."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import types

import numpy as np
import pytest

import audio8_coreai.server.wyoming as wyoming_server
import audio8_coreai.server.wyoming_speaker as wyoming_speaker
from audio8_coreai.settings import DEFAULTS, WyomingSettings
from tests.server.wyoming_support import FRAMES, SEED, serving

RATE = 44100


@pytest.fixture
def stall_s(monkeypatch):
    """The server's ``stall_s``, made short for both halves of the server (its connections and its model side)."""

    def set_stall(seconds: float) -> None:
        server = DEFAULTS.server.model_copy(update={"stall_s": seconds})
        for module in (wyoming_server, wyoming_speaker):
            monkeypatch.setattr(module, "DEFAULTS", DEFAULTS.model_copy(update={"server": server}))

    return set_stall


def _tone(tts, monkeypatch, chunks: int, seconds: float) -> list[int]:
    """Make ``tts.stream`` a stand-in of ``chunks`` chunks of ``seconds`` of tone each (a frame's check before
    each); returns the list that counts the chunks made, across utterances."""
    made: list[int] = []

    class Tone:  # as TTS.stream's stream: its chunks, then the frames it made
        frames = chunks

        def __init__(self, *args, on_frame, **kwargs):
            self.on_frame = on_frame

        def __iter__(self):
            for step in range(chunks):
                self.on_frame(step)
                made.append(step)
                yield np.full(round(seconds * RATE), 0.1, np.float32)

    monkeypatch.setattr(tts, "stream", Tone)
    return made


async def _not_reading(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection with a 4 KiB receive window that has asked for an utterance and reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b'{"type": "synthesize", "data": {"text": "Hello."}}\n')
    await writer.drain()
    return reader, writer


async def _answer_type(port: int, sent: bytes) -> str:
    """The type of the first event a fresh connection that sends ``sent`` gets back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(sent)
    header = json.loads(await asyncio.wait_for(reader.readline(), 30))
    writer.close()
    return header["type"]


async def _audio_of(port: int) -> tuple[int, float]:
    """A reading client's synthesize: the pcm bytes it got and the seconds until its audio-stop."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    writer.write(b'{"type": "synthesize", "data": {"text": "Hello."}}\n')
    got = 0
    while True:
        header = json.loads(await asyncio.wait_for(reader.readline(), 60))
        await reader.readexactly(header.get("data_length") or 0)
        payload = await reader.readexactly(header.get("payload_length") or 0)
        got += len(payload) if header["type"] == "audio-chunk" else 0
        if header["type"] in ("audio-stop", "error"):
            writer.close()
            return got, time.monotonic() - t0


def test_clients_that_read_nothing_do_not_hold_the_model_for_others(never_eos_tts, monkeypatch, stall_s, caplog):  # noqa: F811
    """Three clients ask for 100 s of audio each and read nothing: the model makes theirs whole into their buffers
    (``buffer_s`` 200) and goes on, so a fourth, reading, client has its audio before the first stall would end
    (``stall_s`` 4 s; before, the model waited out each silent client in turn); the silent three are then dropped,
    one line each."""
    stall_s(4.0)
    made = _tone(never_eos_tts, monkeypatch, chunks=20, seconds=5.0)  # 8.8 MB of pcm an utterance: past the sockets
    settings = WyomingSettings(seed=SEED, max_frames=FRAMES, buffer_s=200)

    async def main() -> tuple[int, float, float]:
        async with serving(never_eos_tts, settings) as port:
            t0 = time.monotonic()
            silent = [await _not_reading(port) for _ in range(3)]
            while len(made) < 60:  # their utterances made whole, none waiting on its client
                assert time.monotonic() - t0 < 5, made
                await asyncio.sleep(0.05)
            got, seconds = await _audio_of(port)
            while len(dropped()) < 3:  # each dropped once its stall ends
                assert time.monotonic() - t0 < 30
                await asyncio.sleep(0.05)
            for _, writer in silent:
                writer.close()
            return got, seconds, time.monotonic() - t0

    def dropped() -> list[str]:
        return [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="audio8_coreai.server.wyoming"):
        got, seconds, total = asyncio.run(main())
    assert got == 100 * RATE * 2 and seconds < 4  # all of its 100 s, within the first silent client's stall
    assert len(made) == 80 and total < 30
    assert dropped() == ["dropped a wyoming client: it read nothing for 4 s"] * 3


def test_a_client_that_stops_reading_holds_at_most_its_buffer(never_eos_tts, monkeypatch, stall_s, caplog):  # noqa: F811
    """An utterance that would go on for ever (1 s chunks) to a client that reads nothing: the frames run at most
    ``buffer_s`` (2 s) ahead of what the sockets took, and after ``stall_s`` the connection is reset, the utterance
    stopped, one line logged; the next client is served."""
    stall_s(1.0)
    made = _tone(never_eos_tts, monkeypatch, chunks=10_000, seconds=1.0)
    settings = WyomingSettings(seed=SEED, max_frames=FRAMES, buffer_s=2)

    async def main() -> tuple[float, int]:
        async with serving(never_eos_tts, settings) as port:
            t0 = time.monotonic()
            reader, writer = await _not_reading(port)
            while not made:  # the utterance has begun
                await asyncio.sleep(0.05)
            await asyncio.sleep(4.0)  # reading nothing
            with pytest.raises(ConnectionResetError):  # what the socket held, then the reset
                while await asyncio.wait_for(reader.read(65536), 30):
                    pass
            writer.close()
            made_then = len(made)
            return time.monotonic() - t0, made_then, await _answer_type(port, b'{"type": "describe"}\n')

    with caplog.at_level(logging.WARNING, logger="audio8_coreai.server.wyoming"):
        seconds, made_then, answer = asyncio.run(main())
    # 2 chunks in the buffer, one being written, and what the sockets took before the write blocked: far from the
    # 10,000 the stand-in would make
    assert 3 <= made_then <= 40 and seconds < 30
    assert answer == "info"  # the next client is served
    assert [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()] == [
        "dropped a wyoming client: it read nothing for 1 s"
    ]
    assert not any(r.exc_info for r in caplog.records)


def test_connections_past_the_most_are_refused_busy_and_logged_ten_a_minute(never_eos_tts, monkeypatch, caplog):  # noqa: F811
    """``max_connections`` 2: two idle connections open, fifteen more each get a ``busy`` error at once (ten log
    lines for them, no more; a minute later the five held back are counted in a line of their own before the next);
    once one of the two closes, the next client is served."""
    settings = WyomingSettings(seed=SEED, max_frames=FRAMES, max_connections=2)

    async def main() -> tuple[list[dict], str]:
        async with serving(never_eos_tts, settings) as port:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            await asyncio.sleep(0.2)  # both counted open
            refused = []
            for _ in range(15):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                refused.append(json.loads(await asyncio.wait_for(reader.readline(), 10)))
                refused[-1]["data"] = json.loads(await reader.readexactly(refused[-1]["data_length"]))
                assert await asyncio.wait_for(reader.read(), 10) == b""  # then closed
                writer.close()
                if len(refused) == 15:  # a minute later (the server's clock)
                    later = types.SimpleNamespace(monotonic=lambda: time.monotonic() + 61)
                    monkeypatch.setattr(wyoming_server, "time", later)
                    refused.append(await _answer_type(port, b""))
            held[0][1].close()
            await asyncio.sleep(0.2)  # counted closed
            served = await _answer_type(port, b'{"type": "describe"}\n')
            held[1][1].close()
            return refused, served

    with caplog.at_level(logging.WARNING, logger="audio8_coreai.server.wyoming"):
        refused, served = asyncio.run(main())
    assert [r["type"] for r in refused[:15]] == ["error"] * 15 and refused[15] == "error" and served == "info"
    assert {r["data"]["code"] for r in refused[:15]} == {"busy"}
    assert "its most connections open (2): try again shortly" in refused[0]["data"]["text"]
    lines = [r.getMessage() for r in caplog.records]
    refusal = "refused a wyoming client: 2 connections open, the most (max_connections)"
    held_back = "5 more warnings about wyoming clients were not logged (at most 10 a minute)"
    assert lines == [refusal] * 10 + [held_back, refusal]
