"""uvicorn for this server: its limits on connections, the bounds uvicorn lacks (a deadline for a whole request, a
cap on a request's head), the API's JSON for its own refusals, and its log lines (each with its request's id).

uvicorn closes an idle connection ``timeout_keep_alive`` seconds after an answer and answers 503 beyond
``limit_concurrency`` connections, but times out nothing before a request's head is whole nor while its body
comes: a client that sends half a request holds its connection for ever (slowloris). :func:`bounded_protocol`
adds that: a connection must send a whole request within ``request_timeout_s`` of opening or of its last answer.
:func:`log_config` is uvicorn's logging with the request's id in every line written while it is handled
(:mod:`.requestid`), the server's own lines (the ``audio8_coreai`` loggers) included.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import signal
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..settings import ServerSettings
from .errors import ApiError
from .requestid import REQUEST_ID, RequestIdFilter, request_id

log = logging.getLogger(__name__)


def bounded_protocol(base: type[asyncio.Protocol], settings: ServerSettings) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``base`` (httptools or h11) with the bounds uvicorn lacks:

    * a connection whose request is not whole (head and body) ``request_timeout_s`` seconds after the connection
      opened or its last answer was sent is closed (a request whose body has come whole is left to run: a long
      synthesis is no slow client);
    * a request head past ``max_head_bytes`` (bytes received while no head is whole) is answered 431, before the
      rest is parsed, and ends in a lingering close (below);
    * an answer that starts while its request's body is still coming (a 413) says ``connection: close`` and ends in
      a lingering close: after the answer the server's side is shut (FIN) and the rest of the request is read and
      dropped, up to ``max_unread_body_bytes``, until the client closes or the deadline; so the client, still
      sending, reads its answer rather than a reset (a close with bytes unread resets the connection, and a reset
      can overtake the answer), and sends its next request on a new connection;
    * past ``max_connections`` a request is answered the API's JSON 503 (``too_many_connections``, Retry-After),
      where uvicorn's own is plain text;
    * a response the app leaves incomplete (a stream cut: failed, or dropped for a client that stopped reading)
      aborts its connection: what the server still buffers is discarded and the client sees a reset, where uvicorn's
      graceful close would keep the connection open until a client that reads no more has read it all.
    """

    class Bounded(base):  # type: ignore[misc, valid-type]
        _deadline: asyncio.TimerHandle | None = None
        _head_bytes = 0  # bytes of the head being read (request line and headers)
        _tail = b""  # the last bytes of the head read so far (its end may come in the next read)
        _unread = 0  # bytes of a request body received after its answer was complete
        _refused = False
        _lingering = False  # answered with the request unread: the rest is dropped until the client closes

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.app = _connection_limited(
                self._aborting(self.app), self.connections, self.tasks, self.limit_concurrency
            )
            self.limit_concurrency = None  # checked by the app above instead, so that its 503 is the API's JSON

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            cycle = self.cycle
            if self._lingering:  # the rest of a request its answer left unread: dropped, never parsed
                self._unread += len(data)
                if self._unread > settings.max_unread_body_bytes:
                    self._refused = True
                    self.transport.close()
                return
            if cycle is None or cycle.response_complete:  # reading a head
                seen = self._tail + data  # the end of the head may straddle two reads
                end = seen.find(b"\r\n\r\n")
                size = self._head_bytes + (len(data) if end < 0 else end + 4 - len(self._tail))
                if size > settings.max_head_bytes:  # counted before the head is whole or parsed
                    self._refuse_head()
                    return
                self._head_bytes, self._tail = (size, seen[-3:]) if end < 0 else (0, b"")
            super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._unread = 0
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _aborting(self, app: Any) -> Any:
            async def aborting(scope, receive, send) -> None:
                async def sending(message) -> None:
                    cycle = self.cycle
                    early = cycle is not None and cycle.scope is scope and cycle.more_body
                    if message["type"] == "http.response.start" and early:  # the body is still coming
                        message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
                        cycle.transport = _Lingering(cycle.transport, self._linger)
                    await send(message)

                try:
                    await app(scope, receive, send if scope["type"] != "http" else sending)
                finally:
                    cycle = self.cycle
                    if cycle is not None and cycle.scope is scope and cycle.response_started:
                        if not cycle.response_complete:
                            reset(self.transport)

            return aborting

        def _linger(self) -> None:
            """The answer is whole: shut this side (FIN after it) and drop what the client still sends."""
            self._lingering = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            else:
                self.transport.close()

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(settings.request_timeout_s, self._expire)

        def _expire(self) -> None:
            cycle = self.cycle  # None before the first request's head is whole; then the latest request
            if cycle is None or cycle.response_complete or cycle.more_body:
                self.transport.close()  # a request still reading its body sees a disconnect

        def _refuse_head(self) -> None:
            log.warning("a request head over %d bytes: 431, the rest dropped", settings.max_head_bytes)
            refusal = ApiError(
                431,
                f"the request's head (request line and headers) is over {settings.max_head_bytes} bytes: send "
                "shorter headers",
                code="head_too_large",
            ).response()
            head = (
                f"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                f"content-length: {len(refusal.body)}\r\nx-request-id: {request_id(None)}\r\n"
                "connection: close\r\n\r\n"
            )
            self.transport.write(head.encode("ascii") + refusal.body)
            self._linger()

    return Bounded


class _Lingering:
    """A connection's transport as its request's cycle sees it once the answer began before the body was whole: its
    ``close`` (the answer complete, ``connection: close``) is ``linger`` (see :func:`bounded_protocol`), the rest the
    transport's own."""

    def __init__(self, transport: asyncio.Transport, linger: Any):
        self._transport, self._linger = transport, linger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._linger()


def reset(transport: asyncio.Transport) -> None:
    """Close ``transport``'s connection with a reset: what it buffers is discarded, this process's and the kernel's
    (``SO_LINGER`` 0; a plain close would keep sending the kernel's to a client that may never read it)."""
    if transport.is_closing():  # closed already (the client left): nothing is held for it
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):  # uvloop's socket stand-in: ValueError once it is closed
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _connection_limited(app: Any, connections: set, tasks: set, limit: int | None) -> Any:
    """``app`` (ASGI) answering the API's JSON 503 (with its ``x-request-id``) while ``connections`` reach ``limit``
    or ``tasks`` (this request's included) pass it: uvicorn's own concurrency check, made where the answer is
    ours. ``GET /health`` is answered whatever the load: a probe that restarts a busy server would make it busier."""

    async def limited(scope, receive, send) -> None:
        over = limit is not None and (len(connections) >= limit or len(tasks) > limit)
        if scope["type"] == "http" and over and scope["path"] != "/health":
            rid = request_id(dict(scope["headers"]).get(b"x-request-id"))
            REQUEST_ID.set(rid)
            log.warning("over %d connections: 503", limit)
            busy = ApiError(
                503,
                f"the server holds its limit of {limit} connections; retry later",
                code="too_many_connections",
                headers={"Retry-After": "1", "x-request-id": rid},
            )
            await busy.response()(scope, receive, send)
            return
        await app(scope, receive, send)

    return limited


class CutStreamFilter(logging.Filter):
    """uvicorn's "ASGI callable returned without completing response." as a WARNING, not an ERROR: this server
    leaves a response incomplete only to cut a stream on purpose (dropped for a client that stopped reading, or
    failed after its first bytes), and says why in the line before."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and record.getMessage().startswith("ASGI callable returned without"):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's logging configuration (``uvicorn.config.LOGGING_CONFIG``) with ``[REQUEST-ID] `` after the level
    in every line its handlers write while a request is handled, a cut stream's line a warning
    (:class:`CutStreamFilter`), and the package's loggers written by its default handler (to stderr; their level
    and propagation left as they are)."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["filters"] = {"request_id": {"()": RequestIdFilter}, "cut_stream": {"()": CutStreamFilter}}
    for handler in config["handlers"].values():
        handler["filters"] = ["request_id", "cut_stream"]
    formats = config["formatters"]
    formats["default"]["fmt"] = "%(levelprefix)s %(request_id)s%(message)s"
    formats["access"]["fmt"] = '%(levelprefix)s %(request_id)s%(client_addr)s - "%(request_line)s" %(status_code)s'
    config["loggers"]["audio8_coreai"] = {"handlers": ["default"]}
    return config


def uvicorn_config(
    app: FastAPI, settings: ServerSettings, host: str, port: int, log_level: str = "info"
) -> uvicorn.Config:
    """The uvicorn configuration of ``audio8 serve`` (and of :func:`.app.serve_in_thread`): ``settings``' keep-alive,
    connection limit, head limit (h11's own cap on a head still coming raised to it), request deadline and shutdown
    grace (a stream to a client that reads slowly or not at all
    would hold a SIGTERM until its stall drop), and :func:`log_config`. The protocol is h11's whatever is installed:
    uvicorn's httptools one chunks a streamed answer to an HTTP/1.0 client, which cannot read it, and one protocol
    everywhere is the one the tests run."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=log_config(),
        http=bounded_protocol(H11Protocol, settings),
        h11_max_incomplete_event_size=settings.max_head_bytes,  # h11's own, 16 KB: a head in pieces a plain 400
        timeout_keep_alive=settings.keep_alive_s,
        limit_concurrency=settings.max_connections,
        timeout_graceful_shutdown=settings.shutdown_s,
    )


class Server(uvicorn.Server):
    """uvicorn's server of an app of :func:`.app.create_app`. As its shutdown begins (SIGTERM, SIGHUP, Ctrl-C)
    requests still waiting for a place are refused (503 shutting_down, :meth:`.synth.Synthesizer.drain`); what still
    runs half a second before the grace (``shutdown_s``) ends is ended by the app (:meth:`.synth.Synthesizer.cut`: a
    whole file a 503, a stream cut with one log line), not cancelled by uvicorn (a plain-text 500 and a traceback
    each)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's signals (SIGINT, SIGTERM), and SIGHUP (the terminal closed) shutting down as they do, then
        raised again once the server has stopped, for the command to end by it; a SIGHUP ignored (``nohup``)
        stays ignored."""
        hup = threading.current_thread() is threading.main_thread()
        hup = hup and signal.getsignal(signal.SIGHUP) not in (signal.SIG_IGN, None)
        heard: list[int] = []

        def hang_up(signum: int, frame: object) -> None:
            heard.append(signum)
            self.should_exit = True

        before = signal.signal(signal.SIGHUP, hang_up) if hup else None
        try:
            with super().capture_signals():
                yield
        finally:
            if hup:
                signal.signal(signal.SIGHUP, before)
        if heard:
            signal.raise_signal(signal.SIGHUP)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        synth = self.config.app.state.server.synth
        synth.drain()
        grace = self.config.timeout_graceful_shutdown
        cut = asyncio.get_running_loop().call_later(max((grace or 0.0) - 0.5, 0.0), synth.cut)
        try:
            await super().shutdown(sockets)
        finally:
            cut.cancel()
