"""``audio8 wyoming`` stopping (SIGTERM, SIGINT, SIGHUP; ``serve``'s ``stop`` here): no new connection, idle ones
closed, an answer running ends whole within ``shutdown_s`` or gets a ``shutting_down`` error event, never a
connection closed mid-answer without a word."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.event import async_read_event
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from audio8_coreai import TTS
from audio8_coreai.server.wyoming_serve import serve
from audio8_coreai.server.wyoming_speaker import Speaker
from audio8_coreai.settings import WyomingSettings
from tests.server.wyoming_support import SEED, free_port


async def _connected(port: int) -> AsyncTcpClient:
    """A client connected to the server starting on ``port`` (tried until it listens)."""
    for _ in range(500):
        client = AsyncTcpClient("127.0.0.1", port)
        try:
            await client.connect()
            return client
        except OSError:
            await asyncio.sleep(0.01)
    raise AssertionError(f"nothing listens on port {port}")


def _stopped_while_speaking(checkpoint, max_frames: int, shutdown_s: float) -> tuple[list[str], float, bool]:
    """One client asks a synthesis and a second one stays idle; the server is stopped once the first audio came.
    Returns the speaking client's event types up to the end (None: closed), the seconds from the stop to that
    end, and whether the idle client was closed."""
    settings = WyomingSettings(seed=SEED, max_frames=max_frames, shutdown_s=shutdown_s)

    async def main():
        port, stop = free_port(), asyncio.Event()
        server = asyncio.create_task(
            serve(Speaker(TTS.load(checkpoint, device="cpu"), settings), "127.0.0.1", port, stop)
        )
        idle = await _connected(port)
        kinds = []
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize(text="The meeting has been moved to Thursday.").event())
            while (event := await asyncio.wait_for(client.read_event(), 60)).type != "audio-chunk":
                kinds.append(event.type)
            kinds.append(event.type)
            stop.set()
            stopped = time.monotonic()
            while (event := await asyncio.wait_for(client.read_event(), 60)) is not None:
                if not kinds or kinds[-1] != event.type or event.type != "audio-chunk":
                    kinds.append(event.type)
                if event.type == "error":
                    kinds.append(event.data["code"])
            kinds.append(None)
            ended = time.monotonic() - stopped
        idle_closed = await asyncio.wait_for(idle.read_event(), 10) is None
        await idle.disconnect()
        await server
        return kinds, ended, idle_closed

    return asyncio.run(main())


def test_an_answer_longer_than_the_grace_ends_with_a_shutting_down_error(never_eos_long_checkpoint):
    kinds, ended, idle_closed = _stopped_while_speaking(never_eos_long_checkpoint, 400, shutdown_s=0.5)
    assert kinds == ["audio-start", "audio-chunk", "error", "shutting_down", None], kinds
    assert 0.4 < ended < 5.0 and idle_closed


def test_an_answer_within_the_grace_ends_whole(never_eos_long_checkpoint):
    kinds, ended, idle_closed = _stopped_while_speaking(never_eos_long_checkpoint, 20, shutdown_s=30.0)
    assert kinds == ["audio-start", "audio-chunk", "audio-stop", None], kinds
    assert ended < 25.0 and idle_closed


def test_the_command_ends_by_the_signal_and_says_so(tiny_checkpoint):
    port = free_port()
    command = [sys.executable, "-m", "audio8_coreai", "wyoming", "--model", str(tiny_checkpoint), "--port", str(port)]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        server.send_signal(signal.SIGTERM)
        said = server.communicate(timeout=60)[1]
    finally:
        server.kill()
    assert server.returncode == -signal.SIGTERM and said.rstrip().endswith("terminated"), said[-2000:]
    assert "Traceback" not in said


def test_a_stream_open_at_the_stop_may_end_within_the_grace_else_is_cut(never_eos_long_checkpoint):
    """Home Assistant streams an answer as it is written: a stream open at the stop is an answer under way too.
    Its stop within the grace ends it whole (audio-stop, synthesize-stopped); a stream left open gets the error."""
    settings = WyomingSettings(seed=SEED, max_frames=4, shutdown_s=2.0)

    async def main(finish: bool) -> list[str | None]:
        port, stop = free_port(), asyncio.Event()
        server = asyncio.create_task(
            serve(Speaker(TTS.load(never_eos_long_checkpoint, device="cpu"), settings), "127.0.0.1", port, stop)
        )
        client = await _connected(port)
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk(text="The meeting has been").event())
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.sleep(0.2)
        if finish:
            await client.write_event(SynthesizeChunk(text=" moved to Thursday.").event())
            await client.write_event(SynthesizeStop().event())
        kinds: list[str | None] = []
        while (event := await asyncio.wait_for(client.read_event(), 30)) is not None:
            if not kinds or kinds[-1] != event.type:
                kinds.append(event.type)
        await client.disconnect()
        await server
        return [*kinds, None]

    assert asyncio.run(main(True)) == ["audio-start", "audio-chunk", "audio-stop", "synthesize-stopped", None]
    assert asyncio.run(main(False)) == ["error", None]


def test_a_port_taken_is_an_os_error_and_leaves_the_signals_as_they_were(tiny_tts):
    """Listening fails (the port was taken while the model loaded): OSError, the process's handlers untouched (as
    the command's own, which say the interruption)."""

    def own(signum, frame):
        raise KeyboardInterrupt

    before = {s: signal.signal(s, own) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(OSError):
                asyncio.run(serve(Speaker(tiny_tts, WyomingSettings()), "127.0.0.1", port))
        assert signal.getsignal(signal.SIGTERM) is own and signal.getsignal(signal.SIGHUP) is own
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_an_event_cut_by_the_stop_is_said_as_the_stop(tiny_tts, caplog):
    """A client part-way through sending an event when the stop comes: the stop's error, not a refusal of the
    client's half line (nor a warning about the client in the log)."""

    async def main() -> dict:
        port, stop = free_port(), asyncio.Event()
        server = asyncio.create_task(serve(Speaker(tiny_tts, WyomingSettings()), "127.0.0.1", port, stop))
        await (await _connected(port)).disconnect()  # it listens
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b'{"type": "synthesize", "da')  # no end of line yet
        await writer.drain()
        await asyncio.sleep(0.2)
        stop.set()
        said = await asyncio.wait_for(async_read_event(reader), 10)
        writer.close()
        await server
        return said

    with caplog.at_level("WARNING"):
        said = asyncio.run(main())
    assert said.type == "error" and said.data["code"] == "shutting_down"
    assert "wyoming client refused" not in caplog.text
