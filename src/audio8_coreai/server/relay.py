"""A speech job's items from its worker thread to its request, with back-pressure, and a client's leaving noticed.

A worker makes chunks as fast as the model runs; a client may read slower, or stop reading while keeping its
connection. :class:`Relay` holds unread chunks up to ``bound`` (counted in chunks, or in samples): the worker's
frame loop then waits for room (back-pressure), and gives up after ``stall_s`` seconds (:class:`Stalled`), which
frees the worker. So the audio a stream buffers is bounded (plus one chunk, plus what the sockets hold), whoever is
on the other end. The request is told at once (:attr:`Relay.dropped`): its response may be waiting on a socket that
takes nothing.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
from starlette.requests import Request


class Cancelled(Exception):
    """Raised in a worker's frame loop once the request no longer wants its audio (the client left)."""


class Stalled(Exception):
    """Raised in a worker's frame loop when its client read nothing for ``stall_s`` seconds."""


class Relay:
    """Items (float32 chunks [n] and markers) from one worker thread to one request on the event loop ``loop``:
    unread chunks fill up to ``bound`` units (``per_sample``: samples, else chunks; a chunk is taken while the
    held units are under ``bound``); :meth:`put` blocks the worker until there is room, raising Stalled after
    ``stall_s`` seconds (and setting :attr:`dropped` on the loop) and Cancelled once :meth:`stop` was called."""

    def __init__(self, loop: asyncio.AbstractEventLoop, bound: int, stall_s: float, *, per_sample: bool = False):
        self._loop, self.bound, self.stall_s, self._per_sample = loop, bound, stall_s, per_sample
        self._items: asyncio.Queue[Any] = asyncio.Queue()
        self._room = threading.Condition()
        self._held = 0  # units of the chunks handed over and not yet read
        self.stopped = threading.Event()
        self.dropped = asyncio.Event()  # set when put gave up on a client that read nothing for stall_s

    def _units(self, chunk: np.ndarray) -> int:
        return len(chunk) if self._per_sample else 1

    def put(self, item: Any) -> None:
        """Hand ``item`` to the request (worker thread); a chunk waits for room first. Once the request has stopped,
        a chunk raises Cancelled and a marker (the stream's start or end) is dropped: nobody reads it."""
        chunk = isinstance(item, np.ndarray)
        if chunk:
            with self._room:
                if not self._room.wait_for(lambda: self._held < self.bound or self.stopped.is_set(), self.stall_s):
                    self._loop.call_soon_threadsafe(self.dropped.set)
                    raise Stalled
                self._held += self._units(item)
        if self.stopped.is_set():
            if chunk:
                raise Cancelled
            return
        self._loop.call_soon_threadsafe(self._items.put_nowait, item)

    def check(self) -> None:
        """Raise Cancelled once the request has stopped (called by the worker at every frame)."""
        if self.stopped.is_set():
            raise Cancelled

    async def get(self) -> Any:
        """The next item (event loop); taking a chunk makes room for more."""
        item = await self._items.get()
        if isinstance(item, np.ndarray):
            with self._room:
                self._held -= self._units(item)
                self._room.notify()
        return item

    def interrupt(self, item: Any) -> None:
        """Stop the worker (as :meth:`stop`) and hand ``item`` to the request after what it holds (event loop side):
        the request's last item, whatever the worker would still have given (the server shutting down)."""
        self.stop()
        self._items.put_nowait(item)

    def stop(self) -> None:
        """The request wants no more: the worker stops at its next frame, or at once if it waits for room."""
        self.stopped.set()
        with self._room:
            self._room.notify_all()


async def disconnected(request: Request) -> None:
    """Return when the client of ``request`` disconnects (its body already read whole, the next ASGI message it can
    send is the disconnect): noticed as it happens, not at the next poll or chunk."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
