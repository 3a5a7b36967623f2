"""``GET /``: the web page (type text, pick or upload a voice, hear it as it streams, download it) and its two
files, plain HTML/JS/CSS shipped as package data (``server/static``). The page calls only the public API
(``/v1/voices``, ``/v1/audio/speech``); its Content-Security-Policy lets it load nothing from elsewhere."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)

STATIC = resources.files("audio8_coreai.server") / "static"
# Only this server's own files; audio as blob: URLs the page makes from what it received.
POLICY = "default-src 'self'; media-src 'self' blob:; connect-src 'self' blob:; img-src 'self' data:; object-src 'none'"
HEADERS = {"Cache-Control": "no-cache", "Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff"}


def _file(name: str, media_type: str) -> Response:
    return Response(STATIC.joinpath(name).read_bytes(), media_type=media_type, headers=HEADERS)


@router.get("/")
def page() -> Response:
    """The page (HTML)."""
    return _file("index.html", "text/html; charset=utf-8")


@router.get("/static/app.js")
def script() -> Response:
    """The page's script: the voice list, the upload, speech played as it streams, the download."""
    return _file("app.js", "text/javascript; charset=utf-8")


@router.get("/static/style.css")
def style() -> Response:
    """The page's style sheet."""
    return _file("style.css", "text/css; charset=utf-8")
