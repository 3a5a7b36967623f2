"""The Wyoming tests' shared helpers: a served speaker, conversations held with it, their audio checked."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event

from audio8_coreai import TTS, Voice
from audio8_coreai.audio import encode_speech
from audio8_coreai.server.wyoming_serve import serve
from audio8_coreai.server.wyoming_speaker import Speaker
from audio8_coreai.settings import DEFAULTS, WyomingSettings

SEED = 7
FRAMES = 3  # the server's frame cap: the never-eos checkpoint makes exactly this many frames per utterance
HOP = 2048  # samples per frame
PAUSE = round(DEFAULTS.speech.pause_s * 44100)  # the silence between the sentences of a stream


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_voice(name: str, fingerprint: str) -> Voice:
    codes = np.random.default_rng(0).integers(0, 128, (10, 5))
    return Voice(codes, "Hello there.", 48000, 1.5, fingerprint, "2026-01-01T00:00:00+00:00", name)


@contextlib.asynccontextmanager
async def serving(tts: TTS, settings: WyomingSettings | None = None) -> AsyncIterator[int]:
    """Serve ``tts`` (:func:`serve`, as the command does) on a free loopback port while the block runs; yields
    the port."""
    port, stop = free_port(), asyncio.Event()
    speaker = Speaker(tts, settings or WyomingSettings(seed=SEED, max_frames=FRAMES))
    task = asyncio.create_task(serve(speaker, "127.0.0.1", port, stop))
    for _ in range(500):  # until it listens
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            break
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        stop.set()
        await task


def talk(tts: TTS, *conversations: list[Event | None], settings: WyomingSettings | None = None) -> list[list[Event]]:
    """Hold each conversation (the events to send; None: read the answer up to its last event) with ``tts``
    served, on a connection of its own, all at once; returns what each one received, ending with None where the
    server closed the connection."""

    async def converse(port: int, events: list[Event | None]) -> list[Event]:
        received: list[Event] = []
        async with AsyncTcpClient("127.0.0.1", port) as client:
            for event in events:
                if event is not None:
                    await client.write_event(event)
                    continue
                while True:
                    received.append(answer := await asyncio.wait_for(client.read_event(), 60))
                    if answer is None or answer.type in ("info", "audio-stop", "synthesize-stopped"):
                        break
        return received

    async def main() -> list[list[Event]]:
        async with serving(tts, settings) as port:
            return await asyncio.gather(*(converse(port, c) for c in conversations))

    return asyncio.run(main())


def pcm(events: list[Event]) -> bytes:
    """The audio of ``events``, checking its framing: one audio-start at 44.1 kHz, 16-bit, mono, then chunks in
    the same format with increasing timestamps, then one audio-stop."""
    kinds = [e.type for e in events]
    assert kinds[0] == "audio-start" and kinds.count("audio-start") == 1, kinds
    assert kinds.index("audio-stop") == len([k for k in kinds if k != "synthesize-stopped"]) - 1, kinds
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (44100, 2, 1)
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert chunks and all((c.rate, c.width, c.channels) == (44100, 2, 1) for c in chunks)
    samples = np.cumsum([0] + [len(c.audio) // 2 for c in chunks])
    assert [c.timestamp for c in chunks] == [s * 1000 // 44100 for s in samples[:-1]]
    assert AudioStop.from_event(events[kinds.index("audio-stop")]).timestamp == samples[-1] * 1000 // 44100
    return b"".join(c.audio for c in chunks)


def spoken(tts: TTS, *sentences: str, voice: str | None = None) -> bytes:
    """What :meth:`TTS.stream` says for each of ``sentences`` with the server's seed and cap, joined by the
    stream's pause, as 16-bit pcm."""
    parts = []
    for i, s in enumerate(sentences):
        if i:
            parts.append(np.zeros(PAUSE, np.float32))
        parts.extend(tts.stream(s, seed=SEED, max_frames=FRAMES, voice=voice))
    return encode_speech(np.concatenate(parts), 44100, "pcm")
