"""uvicorn for this server: its limits on connections, a deadline for a whole request that uvicorn lacks, and its
log lines (each with its request's id).

uvicorn closes an idle connection ``timeout_keep_alive`` seconds after an answer and answers 503 beyond
``limit_concurrency`` connections, but times out nothing before a request's head is whole nor while its body
comes: a client that sends half a request holds its connection for ever (slowloris). :func:`deadline_protocol`
adds that: a connection must send a whole request within ``request_timeout_s`` of opening or of its last answer.
:func:`log_config` is uvicorn's logging with the request's id in every line written while it is handled
(:mod:`.requestid`), the server's own lines (the ``audio8_coreai`` loggers) included.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from .requestid import RequestIdFilter
from .state import ServerSettings


def deadline_protocol(base: type[asyncio.Protocol], request_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``base`` (httptools or h11) closing a connection whose request is not whole (head
    and body) ``request_timeout_s`` seconds after the connection opened or its last answer was sent. A request
    whose body has come whole is left to run (a long synthesis is no slow client)."""

    class RequestDeadline(base):  # type: ignore[misc, valid-type]
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(request_timeout_s, self._expire)

        def _expire(self) -> None:
            cycle = self.cycle  # None before the first request's head is whole; then the latest request
            if cycle is None or cycle.response_complete or cycle.more_body:
                self.transport.close()  # a request still reading its body sees a disconnect

    return RequestDeadline


def log_config() -> dict[str, Any]:
    """uvicorn's logging configuration (``uvicorn.config.LOGGING_CONFIG``) with ``[REQUEST-ID] `` after the level
    in every line its handlers write while a request is handled, and the package's loggers written by its default
    handler (to stderr; their level and propagation left as they are)."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["filters"] = {"request_id": {"()": RequestIdFilter}}
    for handler in config["handlers"].values():
        handler["filters"] = ["request_id"]
    formats = config["formatters"]
    formats["default"]["fmt"] = "%(levelprefix)s %(request_id)s%(message)s"
    formats["access"]["fmt"] = '%(levelprefix)s %(request_id)s%(client_addr)s - "%(request_line)s" %(status_code)s'
    config["loggers"]["audio8_coreai"] = {"handlers": ["default"]}
    return config


def uvicorn_config(
    app: FastAPI, settings: ServerSettings, host: str, port: int, log_level: str = "info"
) -> uvicorn.Config:
    """The uvicorn configuration of ``audio8 serve`` (and of :func:`.app.serve_in_thread`): ``settings``' keep-alive,
    connection limit and request deadline, and :func:`log_config`."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=log_config(),
        http=deadline_protocol(AutoHTTPProtocol, settings.request_timeout_s),
        timeout_keep_alive=settings.keep_alive_s,
        limit_concurrency=settings.max_connections,
    )
