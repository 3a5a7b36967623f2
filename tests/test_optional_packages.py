"""The package without av, pedalboard, sse_starlette and opentelemetry (a lent GPU machine has none of them): it
imports, loads, speaks and writes wav, mp3, pcm and flac (API, CLI, server), and aac, a speed other than 1.0 and
stream_format sse are refused with an error naming the package and its install. One subprocess, where those
modules cannot be imported (a sitecustomize, so the processes it starts have none either), checks it all
(tests/missing_packages_probe.py) and the tests read what it printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MISSING = ("av", "pedalboard", "sse_starlette", "opentelemetry")
SITE = """import os, sys
for name in os.environ["PROBE_MISSING_PACKAGES"].split(","):
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError, as for a package not installed
"""
INSTALLS = {
    "av": "pip install av",
    "pedalboard": "pip install pedalboard",
    "sse_starlette": "pip install sse-starlette",
}


@pytest.fixture(scope="module")
def probe(tiny_checkpoint, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("missing")
    (folder / "sitecustomize.py").write_text(SITE)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PROBE_MISSING_PACKAGES": ",".join(MISSING)}
    script = Path(__file__).with_name("missing_packages_probe.py")
    ran = subprocess.run(
        [sys.executable, str(script), str(tiny_checkpoint), str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-4000:]
    return json.loads(ran.stdout.strip().splitlines()[-1])


def test_the_package_imports_loads_and_speaks_without_them(probe):
    assert set(MISSING) <= set(probe["missing"])  # the subprocess could import none of them
    assert set(MISSING) - {"opentelemetry"} <= set(probe["still_missing"])  # nor did the server, after
    said = probe["synthesize"]
    assert said["rate"] == 44100 and said["samples"] > 0 and said["samples"] % 2048 == 0 and said["peak"] > 0
    assert probe["generate"]["samples"] == said["samples"] and probe["generate"]["codes"][1] * 2048 == said["samples"]
    assert probe["wav"] == {"samples": said["samples"], "rate": 44100}
    assert probe["bodies"]["wav"] == 44 + 2 * said["samples"] and probe["bodies"]["pcm"] == 2 * said["samples"]
    assert probe["bodies"]["flac"] > 0 and probe["bodies"]["mp3"] > 0
    assert probe["speed_1"]  # speed 1.0 needs no stretch, so no pedalboard


def test_the_api_refuses_aac_and_speed_naming_the_install(probe):
    refusals = probe["api_refusals"]
    for call in ("encode aac", "stream aac"):
        assert refusals[call].startswith("AudioError: response_format aac needs the av package")
        assert INSTALLS["av"] in refusals[call] and "wav" in refusals[call]
    for call in ("time_stretch", "StreamStretcher"):
        assert refusals[call].startswith("AudioError: a speed other than 1.0")
        assert "pedalboard package" in refusals[call] and INSTALLS["pedalboard"] in refusals[call]


def test_audio8_say_writes_wav_and_flac_without_them(probe):
    for suffix in ("wav", "flac"):
        said = probe["cli"][suffix]
        assert said["exit"] == 0, said["output"]
        assert said["samples"] == probe["synthesize"]["samples"]  # seed 1, as the API's
        assert "Traceback" not in said["output"]


def test_the_server_speaks_and_refuses_aac_speed_and_sse_with_a_code(probe):
    http, samples = probe["http"], probe["synthesize"]["samples"]
    assert http["wav"] == {"status": 200, "head": "RIFF", "bytes": 44 + 2 * samples}
    assert http["mp3"]["status"] == 200 and http["mp3"]["bytes"] > 0
    assert http["pcm"]["status"] == 200 and http["pcm"]["bytes"] > 0  # speed 1.0 sent, as SDKs do
    for name, module, param, code in (
        ("aac", "av", "response_format", "unsupported_format"),
        ("speed", "pedalboard", "speed", "unsupported_speed"),
        ("sse", "sse_starlette", "stream_format", "unsupported_stream_format"),
    ):
        error = http[name]["error"]
        assert http[name]["status"] == 400 and error["code"] == code and error["param"] == param
        assert f"needs the {module} package" in error["message"] and INSTALLS[module] in error["message"]
        assert "Traceback" not in error["message"]


@pytest.mark.parametrize(
    ("blocked", "args", "extra"),
    [
        ("wyoming", ["wyoming", "--port", "1"], "wyoming"),
        ("ray", ["serve", "--ray"], "ray"),
        ("coreai", ["say", "Hi.", "-o", "{tmp}/o.wav", "--backend", "coreai", "--assets", "{tmp}"], "coreai"),
    ],
)
def test_a_command_without_its_extra_names_both_installs(tiny_checkpoint, tmp_path, blocked, args, extra):
    """The extra's pip command from the package index and from a clone (where the index's name fetched another
    copy, and the README says pip install -e '.[EXTRA]')."""
    (tmp_path / "sitecustomize.py").write_text(SITE)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PROBE_MISSING_PACKAGES": blocked, "COLUMNS": "250"}
    args = [a.replace("{tmp}", str(tmp_path)) for a in args] + ["--model", str(tiny_checkpoint)]
    ran = subprocess.run(
        [sys.executable, "-m", "audio8_coreai.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )
    said = " ".join(ran.stderr.split())
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert f"pip install 'audio8-coreai[{extra}]' (in a clone of the repository: pip install -e '.[{extra}]')" in said
