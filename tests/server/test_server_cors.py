"""Browsers: a web page on another origin calls the API only where ``server.cors_origins`` names it (CORS)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from audio8_coreai.errors import ConfigError
from audio8_coreai.server.app import EXPOSED_HEADERS, create_app
from audio8_coreai.settings import DEFAULTS, override

PAGE = "https://app.example.com"
SPEECH = {"model": "audio8", "input": "Hi.", "seed": 3, "max_frames": 2, "response_format": "wav"}
PREFLIGHT = {
    "Origin": PAGE,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


@pytest.fixture(scope="module")
def client(tiny_tts):
    settings = override(DEFAULTS.server, cors_origins=(PAGE, "http://localhost:3000"))
    with TestClient(create_app([tiny_tts], settings)) as client:
        yield client


def test_a_named_origin_is_answered_and_reads_the_servers_headers(client):
    r = client.options("/v1/audio/speech", headers=PREFLIGHT)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == PAGE
    assert "POST" in r.headers["access-control-allow-methods"]
    assert set(r.headers["access-control-allow-headers"].split(", ")) >= {"authorization", "content-type"}
    r = client.post("/v1/audio/speech", json=SPEECH, headers={"Origin": PAGE})
    assert r.status_code == 200 and r.content[:4] == b"RIFF"
    assert r.headers["access-control-allow-origin"] == PAGE
    exposed = set(r.headers["access-control-expose-headers"].split(", "))
    assert exposed == set(EXPOSED_HEADERS) and r.headers["x-seed"] == "3"


def test_an_error_answer_reaches_the_page_too(client):
    r = client.post("/v1/audio/speech", content=b"{" + b" " * (2**20 + 10), headers={"Origin": PAGE})
    assert r.status_code == 413 and r.headers["access-control-allow-origin"] == PAGE


def test_another_origin_is_refused(client):
    r = client.options("/v1/audio/speech", headers={**PREFLIGHT, "Origin": "https://evil.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    assert r.headers["content-type"] == "application/json" and r.json()["error"]["code"] == "cors_refused"
    assert r.json()["error"]["message"] == (
        "CORS preflight refused (Disallowed CORS origin): a page may call this server from the origins its "
        "--cors-origin names (AUDIO8_SERVER__CORS_ORIGINS), with DELETE, GET, HEAD, POST"
    )
    put = {**PREFLIGHT, "Access-Control-Request-Method": "PUT"}
    assert (
        client.options("/v1/audio/speech", headers=put)
        .json()["error"]["message"]
        .startswith("CORS preflight refused (Disallowed CORS method)")
    )
    r = client.get("/health", headers={"Origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_by_default_only_the_same_origin_calls(tiny_tts):
    assert DEFAULTS.server.cors_origins == ()
    with TestClient(create_app([tiny_tts])) as client:
        assert client.options("/v1/audio/speech", headers=PREFLIGHT).status_code == 405
        r = client.get("/health", headers={"Origin": PAGE})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_any_origin_with_a_star(tiny_tts):
    with TestClient(create_app([tiny_tts], override(DEFAULTS.server, cors_origins=("*",)))) as client:
        r = client.options("/v1/audio/voices", headers={**PREFLIGHT, "Access-Control-Request-Method": "GET"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize(
    "origin", ["https://app.example.com/", "app.example.com", "https://app.example.com/x", "", "https://*.example.com"]
)
def test_an_origin_is_scheme_host_and_port(origin):
    with pytest.raises(ConfigError, match="an origin is scheme://host\\[:port\\] with no path"):
        override(DEFAULTS.server, cors_origins=(origin,))
    assert override(DEFAULTS.server, cors_origins=("http://localhost:3000",)).cors_origins == ("http://localhost:3000",)
    given = ("https://App.Example.com", "https://a.example:443", "http://b.example:80", "http://c.example:8080")
    assert override(DEFAULTS.server, cors_origins=given).cors_origins == (  # as a browser sends them
        "https://app.example.com",
        "https://a.example",
        "http://b.example",
        "http://c.example:8080",
    )
