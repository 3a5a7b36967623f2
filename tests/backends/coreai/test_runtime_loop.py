"""The runtime's event loop thread (backends/coreai/runtime.py): a Ctrl-C waits for the call it interrupts (the
runtime aborted the process, SIGABRT, when it exited with a call running). Needs no Core AI package."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time

import pytest

from audio8_coreai.backends.coreai.runtime import _RuntimeLoop


def test_ctrl_c_is_raised_once_the_running_call_is_done():
    loop = _RuntimeLoop()
    finished = []

    async def call() -> str:
        await asyncio.sleep(0.4)
        finished.append(time.monotonic())
        return "done"

    try:
        assert loop.run(call()) == "done"
        main = threading.main_thread().ident

        def ctrl_c() -> None:  # a real SIGINT to the main thread: it wakes the blocked wait, as a terminal's does
            signal.pthread_kill(main, signal.SIGINT)

        timers = [threading.Timer(delay, ctrl_c) for delay in (0.05, 0.15)]  # two Ctrl-Cs
        for timer in timers:
            timer.start()
        with pytest.raises(KeyboardInterrupt):
            loop.run(call())
        raised = time.monotonic()
        assert len(finished) == 2 and finished[1] <= raised  # the call ran to its end before the interrupt
        for timer in timers:
            timer.join()
    finally:
        loop.close(contextlib.AsyncExitStack())
