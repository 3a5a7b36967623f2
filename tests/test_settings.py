"""The settings tree (settings.py): its defaults, AUDIO8_* environment variables over them, a wrong one said in one
line (by the API as a ConfigError, by the command as one 'error:' line), the fields' constraints, a command's
options validated the same way, and --help showing the defaults the fields hold."""

from __future__ import annotations

import os
import subprocess
import sys
import typing

import pydantic
import pytest

from audio8_coreai.audio import MPEG_RATES
from audio8_coreai.errors import ConfigError
from audio8_coreai.request import MAX_SEED
from audio8_coreai.settings import (
    DEFAULTS,
    RaySettings,
    SampleRate,
    ServerSettings,
    Settings,
    SpeechSettings,
    TorchSettings,
    WyomingSettings,
    from_environment,
    override,
)
from audio8_coreai.settings_words import takes


@pytest.fixture
def env(monkeypatch):
    """No AUDIO8_* variable but those a test sets (monkeypatch.setenv)."""
    for key in list(os.environ):
        if key.upper().startswith("AUDIO8_"):
            monkeypatch.delenv(key)
    return monkeypatch


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m audio8_coreai.cli ARGS`` with ``env`` added, wide enough that help lines are not cut."""
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("AUDIO8_")}
    environ.update(COLUMNS="250", TERM="dumb", **env)
    command = [sys.executable, "-m", "audio8_coreai.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=environ, timeout=120)


def test_the_defaults_are_the_fields_defaults(env):
    tree = from_environment()
    assert tree == Settings() and tree.server == ServerSettings()
    assert (tree.server.host, tree.server.port, tree.server.workers, tree.server.max_queue) == ("127.0.0.1", 8000, 1, 8)
    assert (tree.speech.chunk_frames, tree.speech.first_chunk_frames, tree.wyoming.port) == (16, 1, 10200)
    assert tree.torch.batch_buckets == (1, 2, 4, 8, 16, 32, 64, 128, 256) and tree.torch.cuda_graphs is None
    assert (tree.ray.replicas, tree.bench.frames, tree.measure.tolerance, tree.coreai.encoder_frames) == (
        1,
        32,
        1e-4,
        216,
    )
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        DEFAULTS.server.port = 1  # type: ignore[misc]


def test_environment_variables_set_fields(env):
    env.setenv("AUDIO8_SERVER__PORT", "9000")
    env.setenv("audio8_speech__chunk_frames", "8")  # any case
    env.setenv("AUDIO8_TORCH__CUDA_GRAPHS", "false")
    env.setenv("AUDIO8_TORCH__CODEC_THREADS", "none")
    env.setenv("AUDIO8_TORCH__FUSED_KERNELS", "None")  # none in any case, or null
    env.setenv("AUDIO8_SERVER__DEFAULT_VOICE", "NULL")
    env.setenv("AUDIO8_TORCH__BATCH_BUCKETS", "[1, 4, 16]")
    env.setenv("AUDIO8_SERVER__VOICE_MAP", '{"alloy": "ana"}')
    env.setenv("AUDIO8_SERVER__CORS_ORIGINS", '["https://app.example.com"]')
    env.setenv("AUDIO8_RAY__AUTOSCALE", "[1, 8]")
    env.setenv("AUDIO8_WYOMING", '{"voice": "house", "idle_s": 5}')  # a group as one JSON object
    env.setenv("AUDIO8_SERVER__SAMPLE_RATE", "16000")  # a Literal of ints: every rate was refused as text
    tree = from_environment()
    assert (tree.server.port, tree.server.workers, tree.speech.chunk_frames) == (9000, 1, 8)
    assert tree.torch.cuda_graphs is False and tree.torch.codec_threads is None
    assert tree.torch.fused_kernels is None and tree.server.default_voice is None
    assert tree.torch.batch_buckets == (1, 4, 16) and tree.server.voice_map == {"alloy": "ana"}
    assert tree.server.sample_rate == 16000 and tree.server.cors_origins == ("https://app.example.com",)
    assert tree.ray.autoscale == (1, 8) and (tree.wyoming.voice, tree.wyoming.idle_s, tree.wyoming.port) == (
        "house",
        5.0,
        10200,
    )
    assert DEFAULTS.server.port == 8000  # built once, at import: a later variable changes a new tree only


@pytest.mark.parametrize(
    "name, value, said",
    [
        ("AUDIO8_SERVER__PORT", "99999", "AUDIO8_SERVER__PORT must be a whole number 1 to 65535, got '99999'"),
        ("AUDIO8_SERVER__PORT", "eighty", "AUDIO8_SERVER__PORT must be a whole number 1 to 65535, got 'eighty'"),
        ("AUDIO8_SERVER__WORKERS", "0", "AUDIO8_SERVER__WORKERS must be a whole number >= 1, got '0'"),
        ("AUDIO8_MEASURE__TOLERANCE", "inf", "AUDIO8_MEASURE__TOLERANCE must be a finite number > 0, got 'inf'"),
        ("AUDIO8_SERVER__STALL_S", "inf", "AUDIO8_SERVER__STALL_S must be a finite number > 0, got 'inf'"),
        ("AUDIO8_WYOMING__IDLE_S", "Infinity", "AUDIO8_WYOMING__IDLE_S must be a finite number > 0, got 'Infinity'"),
        ("AUDIO8_TORCH__CUDA_GRAPHS", "maybe", "AUDIO8_TORCH__CUDA_GRAPHS must be true, false or none, got 'maybe'"),
        ("AUDIO8_SERVER__PORT", "None", "AUDIO8_SERVER__PORT must be a whole number 1 to 65535, got 'None'"),
        ("AUDIO8_SERVER__VOICE_MAP", '{"alloy": "a", "Alloy": "b"}', "AUDIO8_SERVER__VOICE_MAP: voice_map maps a name"),
        ("AUDIO8_SERVER__SAMPLE_RATE", "9000", "AUDIO8_SERVER__SAMPLE_RATE must be one of 8000, 11025, 12000, 16000"),
        ("AUDIO8_SERVER__PORTT", "9000", "AUDIO8_SERVER__PORTT is not a setting: the server group has host, port,"),
        (
            "AUDIO8_TORCH__BATCH_BUCKETS",
            "1,2",
            "AUDIO8_TORCH__BATCH_BUCKETS is not JSON: give it as JSON such as [1, 2,",
        ),
        ("AUDIO8_TORCH__BATCH_BUCKETS", "[4, 2]", "AUDIO8_TORCH__BATCH_BUCKETS: batch_buckets must be rising"),
        (
            "AUDIO8_SERVER__CORS_ORIGINS",
            "*",
            'AUDIO8_SERVER__CORS_ORIGINS is not JSON: give it as JSON such as ["https:',
        ),
        ("AUDIO8_SERVER", "port=1", 'AUDIO8_SERVER is not JSON: give it as JSON, e.g. {"port": 8000} for a group'),
        ("AUDIO8_SERVER__CORS_ORIGINS", '["a.example"]', "AUDIO8_SERVER__CORS_ORIGINS: cors_origins holds 'a.example'"),
        ("AUDIO8_SERVER", '{"port": 0}', "AUDIO8_SERVER's port must be a whole number 1 to 65535, got 0"),
        ("AUDIO8_SERVER", "8000", 'AUDIO8_SERVER is a group: give it as a JSON object, e.g. {"port": 8000}, or set'),
        ("AUDIO8_SERVER", "[1]", "AUDIO8_SERVER is a group: give it as a JSON object"),
        ("AUDIO8_SERVER", "null", "AUDIO8_SERVER is a group: give it as a JSON object"),
        ("AUDIO8_SERVER__", "1", "AUDIO8_SERVER__ is not a setting: a variable is AUDIO8_<GROUP>__<FIELD>"),
        ("AUDIO8_BENCH__CODEC_DTYPE", "fp16", "AUDIO8_BENCH__CODEC_DTYPE must be one of fp32, bf16, float32, bfloat16"),
        ("AUDIO8_BENCH__BACKEND", "coreai", "AUDIO8_BENCH__BACKEND must be one of torch, got 'coreai'"),
        ("AUDIO8_SERVR__PORT", "1", "AUDIO8_SERVR__PORT is not a setting: a variable is AUDIO8_<GROUP>__<FIELD> with"),
        ("AUDIO8_PORT", "1", "AUDIO8_PORT is not a setting: a variable is AUDIO8_<GROUP>__<FIELD> with GROUP one of"),
        ("AUDIO8_SPEECH____CHUNK_FRAMES", "1", "AUDIO8_SPEECH____CHUNK_FRAMES is not a setting: the speech group has"),
        ("AUDIO8_SERVER__HOST", "", "AUDIO8_SERVER__HOST must be non-empty text, got ''"),
        (
            "AUDIO8_SPEECH__SPLIT_FRAMES_PER_TOKEN",
            "100000",
            "AUDIO8_SPEECH__SPLIT_FRAMES_PER_TOKEN must be a whole number 1 to 64",
        ),
    ],
)
def test_a_wrong_variable_is_named_with_what_it_takes(env, name, value, said):
    env.setenv(name, value)
    with pytest.raises(ConfigError) as e:
        from_environment()
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_a_key_of_a_mapping_setting_is_a_variable_of_its_own(env):
    env.setenv("AUDIO8_SERVER__VOICE_MAP__ALLOY", "ana")  # pydantic-settings' nested form, as the JSON one
    assert from_environment().server.voice_map == {"alloy": "ana"}


def test_the_command_says_a_wrong_variable_in_one_line():
    ran = run_cli("say", "Hello.", AUDIO8_SERVER__PORT="99999")
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr == "error: AUDIO8_SERVER__PORT must be a whole number 1 to 65535, got '99999'\n"


@pytest.mark.parametrize(
    "build",
    [
        lambda: ServerSettings(port=-1),
        lambda: ServerSettings(port=70000),
        lambda: ServerSettings(workers=0),
        lambda: ServerSettings(max_queue=-1),
        lambda: ServerSettings(max_upload_bytes=2**40),
        lambda: ServerSettings(sample_rate=9000),
        lambda: ServerSettings(workers=2, extra=1),  # a misspelt field is an error, not a default
        lambda: SpeechSettings(chunk_frames=0),
        lambda: SpeechSettings(chunk_frames=4, first_chunk_frames=5),
        lambda: TorchSettings(batch_buckets=()),
        lambda: TorchSettings(batch_buckets=(4, 2)),
        lambda: RaySettings(replicas=0),
        lambda: RaySettings(autoscale=(3, 1)),
        lambda: RaySettings(gpus=-1),
        lambda: WyomingSettings(top_p=1.5),
        lambda: WyomingSettings(temperature=float("nan")),
        lambda: WyomingSettings(seed=2**53),
    ],
)
def test_absurd_values_are_refused(build):
    with pytest.raises(pydantic.ValidationError):
        build()


def test_a_commands_options_override_a_group_validated():
    server = override(DEFAULTS.server, port=9000, workers=2)
    assert (server.port, server.workers, server.max_queue) == (9000, 2, DEFAULTS.server.max_queue)
    assert DEFAULTS.server.port == 8000
    for group, changes, said in [
        (DEFAULTS.server, {"port": 0}, "--port must be 1 to 65535, got 0"),
        (DEFAULTS.server, {"workers": 0}, "--workers must be >= 1, got 0"),
        (DEFAULTS.server, {"chunk_frames": 4, "first_chunk_frames": 5}, "--first-chunk-frames must be 1 to "),
        (DEFAULTS.ray, {"gpus": -1.0}, "--replica-gpus must be a finite number >= 0, got -1.0"),
        (DEFAULTS.measure, {"tolerance": -1.0}, "--tolerance must be a finite number > 0, got -1.0"),
    ]:
        with pytest.raises(ConfigError) as e:
            override(group, {"gpus": "--replica-gpus"}, **changes)
        assert str(e.value).startswith(said), str(e.value)


def test_what_a_field_takes_in_words():
    fields = Settings.model_fields
    server, torch_ = ServerSettings.model_fields, TorchSettings.model_fields
    assert takes(server["port"]) == "a whole number 1 to 65535" and takes(server["port"], typed=False) == "1 to 65535"
    assert takes(torch_["cuda_graphs"]) == "true, false or none"
    assert takes(server["max_frames"]) == "a whole number >= 1 or none"
    assert takes(fields["measure"].annotation.model_fields["tolerance"]) == "a finite number > 0"  # inf is refused
    assert takes(torch_["batch_buckets"]) == "JSON such as [1, 2, 4, 8, 16, 32, 64, 128, 256]"
    assert takes(server["cors_origins"]) == 'JSON such as ["https://app.example.com", "http://localhost:3000"]'


def test_the_sample_rates_are_those_every_format_takes():
    assert typing.get_args(SampleRate) == tuple(MPEG_RATES)


def test_seeds_stop_where_a_requests_do():
    for info in (ServerSettings.model_fields["default_voice_seed"], WyomingSettings.model_fields["seed"]):
        assert takes(info, typed=False) == f"0 to {MAX_SEED}"


def test_help_shows_the_defaults_the_fields_hold():
    """--help shows each default as the field holds it: AUDIO8_* variables move them."""
    plain = run_cli("serve", "--help")
    assert plain.returncode == 0 and "[default: 8000]" in plain.stdout and "TCP port." in plain.stdout
    moved = run_cli("serve", "--help", AUDIO8_SERVER__PORT="9123", AUDIO8_SERVER__MAX_QUEUE="3")
    assert "[default: 9123]" in moved.stdout and "[default: 3]" in moved.stdout
    assert "[default: 8000]" not in moved.stdout
    mapped = run_cli("serve", "--help", AUDIO8_SERVER__VOICE_MAP='{"alloy": "ana"}', AUDIO8_SERVER__DEFAULT_VOICE="bo")
    assert "[default: (alloy=ana)]" in mapped.stdout and "[default: bo]" in mapped.stdout
    assert "pip install 'audio8-coreai[ray]'" in plain.stdout and "pip install -e '.[ray]'" in plain.stdout  # text
    wyoming = run_cli("wyoming", "--help", AUDIO8_WYOMING__PORT="10300")
    assert "[default: 10300]" in wyoming.stdout
    bench = run_cli("bench", "--help", AUDIO8_BENCH__RUNS="7")
    assert "Timed runs after one warm-up (medians reported)." in bench.stdout and "[default: 7]" in bench.stdout


def test_a_bench_precision_from_the_environment_is_checked_before_measuring(tiny_checkpoint):
    """The bench's default precision may come from AUDIO8_BENCH__PRECISION: an unknown one is one line naming both
    ways to set it, before any checkpoint is made or worker started."""
    done = run_cli("bench", "--model", str(tiny_checkpoint), "--no-rss", AUDIO8_BENCH__PRECISION="int3")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: unknown precision 'int3'") and "AUDIO8_BENCH__PRECISION" in done.stderr


def test_serve_checks_its_upload_limit_before_loading():
    from typer.testing import CliRunner

    from audio8_coreai.cli import app

    result = CliRunner().invoke(app, ["serve", "--max-upload-mb", "0"])
    assert result.exit_code != 0 and "--max-upload-mb must be over 0" in result.output


def test_the_default_upload_limit_takes_30_s_of_96_khz_stereo_float():
    assert ServerSettings().max_upload_bytes >= 30 * 96000 * 2 * 4 + 1024
