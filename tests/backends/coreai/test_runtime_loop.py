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
    sent = threading.Event()  # both Ctrl-Cs were sent: the call cannot end before them, however loaded the machine

    async def call(until: threading.Event | None = None) -> str:
        while until is not None and not until.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        finished.append(time.monotonic())
        return "done"

    # Python's own handler, as a terminal's process has it: one started in the background of a script inherits
    # SIGINT ignored, and Python then installs none (the signal would do nothing here).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert loop.run(call()) == "done"
        main = threading.main_thread().ident

        def ctrl_c(last: bool) -> None:  # a real SIGINT to the main thread: it wakes the blocked wait, as a terminal's
            signal.pthread_kill(main, signal.SIGINT)
            if last:
                sent.set()

        timers = [threading.Timer(delay, ctrl_c, (last,)) for delay, last in ((0.05, False), (0.15, True))]  # two
        for timer in timers:
            timer.start()
        with pytest.raises(KeyboardInterrupt):
            loop.run(call(sent))
        raised = time.monotonic()
        assert len(finished) == 2 and finished[1] <= raised  # the call ran to its end before the interrupt
        for timer in timers:
            timer.join()
    finally:
        signal.signal(signal.SIGINT, before)
        loop.close(contextlib.AsyncExitStack())
