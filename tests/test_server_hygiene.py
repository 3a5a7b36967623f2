"""What serving leaves alone and keeps to itself: the host process's warning filters, and the server's paths
(no answer names the checkpoint's or the Core AI assets' folder)."""

from __future__ import annotations

import warnings

import pytest
from fastapi.testclient import TestClient

from audio8_coreai import UnsupportedLanguageWarning
from audio8_coreai.server.app import create_app

RUSSIAN = "Привет, как дела?"
SPEECH = {"model": "audio8", "seed": 1, "max_frames": 2, "response_format": "wav"}


def test_create_app_leaves_the_warning_filters_alone(tiny_tts):
    before = list(warnings.filters)
    app = create_app([tiny_tts])
    assert warnings.filters == before
    with warnings.catch_warnings(record=True) as caught:  # the workers' threads too: showwarning is global
        warnings.simplefilter("always")
        with TestClient(app) as client:
            r = client.post("/v1/audio/speech", json={**SPEECH, "input": RUSSIAN})
    assert r.status_code == 200 and "Cyrillic" in r.headers["X-Audio8-Warning"]
    assert [w for w in caught if issubclass(w.category, UnsupportedLanguageWarning)] == []  # said in the header
    assert warnings.filters == before
    with pytest.warns(UnsupportedLanguageWarning, match="Cyrillic"):  # the API in this process still warns
        tiny_tts.stream(RUSSIAN, seed=1, max_frames=2)
