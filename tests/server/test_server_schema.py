"""`audio8 serve` fuzzed by schemathesis from its own OpenAPI schema (bounded): no 5xx, and every answer as the schema
says (status codes, media types, bodies). Issue 17's full run was 81,752 cases; here a few per operation, seeded.

Not checked: that data the schema allows is accepted, because the schema cannot say all a request needs (an audio
file that decodes, text with a letter in it, a stored voice's name).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from audio8_coreai import TTS
from audio8_coreai.server import create_app, serve_in_thread
from audio8_coreai.settings import ServerSettings


@pytest.fixture(scope="module")
def api_schema(tiny_checkpoint, tmp_path_factory):
    instance = TTS.load(tiny_checkpoint, device="cpu", voices_dir=tmp_path_factory.mktemp("voices"))
    settings_ = ServerSettings(workers=1, max_queue=16, max_input_chars=300, max_upload_bytes=200_000, max_frames=4)
    with serve_in_thread(create_app([instance], settings_)) as url:
        yield schemathesis.openapi.from_url(f"{url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_answer_is_as_the_schema_says_and_none_is_a_5xx(case):
    case.call_and_validate(excluded_checks=[positive_data_acceptance], timeout=120)


def test_the_schema_says_what_the_speech_fields_take(api_schema):
    """The voice as a name or OpenAI's {"id": NAME} (a client made from the schema sends both), the input's limit and
    the rates each format takes."""
    fields = api_schema.raw_schema["components"]["schemas"]["SpeechRequest"]["properties"]
    voice_object = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    assert {**voice_object, "additionalProperties": False} in fields["voice"]["anyOf"]
    assert "max_input_chars (4096 unless set)" in fields["input"]["description"]
    assert fields["sample_rate"]["description"].endswith("; opus only 48000")
