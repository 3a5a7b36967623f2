"""The Wyoming server's life (``audio8 wyoming``): it listens, serves each connection with a
:class:`.wyoming.WyomingHandler`, and stops as :mod:`.wyoming` says (no new connection, idle ones closed, answers
running given ``shutdown_s`` and then cut with a ``shutting_down`` error event)."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading

from .wyoming import Doors, WyomingHandler
from .wyoming_speaker import Speaker

log = logging.getLogger(__name__)


async def serve(speaker: Speaker, host: str, port: int, stop: asyncio.Event | None = None) -> None:
    """Serve ``speaker`` on tcp://``host``:``port`` until ``stop`` is set or, on the main thread, SIGTERM, SIGINT or
    SIGHUP (unless ignored: nohup) comes; then stop as the module's docstring says, and raise that signal again
    once all is closed, for the command to end by it. Raises OSError when the port cannot be listened on."""
    stop = stop or asyncio.Event()
    doors = Doors(speaker.settings.max_connections)
    running: dict[asyncio.Task, WyomingHandler] = {}

    def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = WyomingHandler(reader, writer, speaker, doors)
        task = asyncio.create_task(handler.run(), name="wyoming connection")
        running[task] = handler
        task.add_done_callback(lambda done: running.pop(done, None))

    loop, heard = asyncio.get_running_loop(), []
    signals = _stop_signals() if threading.current_thread() is threading.main_thread() else {}
    try:
        listener = await asyncio.start_server(connected, host, port)
        try:
            for signum in signals:
                loop.add_signal_handler(signum, lambda signum=signum: (heard.append(signum), stop.set()))
            await stop.wait()
        finally:
            listener.close()
            for signum, before in signals.items():  # the command's own again (loop.remove_signal_handler: SIG_DFL)
                loop.remove_signal_handler(signum)
                signal.signal(signum, before)
            await _wind_down(running, speaker.settings.shutdown_s)
    finally:
        await speaker.close()
    if heard:
        signal.raise_signal(heard[-1])


def _stop_signals() -> dict[int, object]:
    """The signals that stop the server, each with the handler it had (SIGHUP left out where it is ignored)."""
    signals = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    kept = {s: h for s, h in signals.items() if s != signal.SIGHUP or h is not signal.SIG_IGN}
    return {s: signal.SIG_DFL if h is None else h for s, h in kept.items()}  # None: not set from Python


async def _wind_down(running: dict[asyncio.Task, WyomingHandler], grace_s: float) -> None:
    """Close the idle connections of ``running``, give the answers running ``grace_s`` seconds, then cut them."""
    if not running:
        return
    answering = sum(handler.busy for handler in running.values())
    log.info("wyoming stopping: %d answer(s) running get up to %g s", answering, grace_s)
    for handler in list(running.values()):
        await handler.stop()
    await asyncio.wait(list(running), timeout=grace_s)
    for task, handler in list(running.items()):
        log.warning("a wyoming answer was cut: the server is shutting down")
        handler.cut(task)
    if running:
        await asyncio.wait(list(running), timeout=5.0)
