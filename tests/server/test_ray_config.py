"""`audio8 serve --ray`'s configuration, checked before Ray starts: the Serve config file, the scale settings and the
CLI's options, a local checkpoint and the voice map."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from audio8_coreai.settings import RaySettings

pytest.importorskip("ray.serve")

from ray import serve  # noqa: E402

from audio8_coreai.server.ray_app import build_app  # noqa: E402


def test_the_serve_config_builds_the_application():
    import pydantic
    import yaml

    config = yaml.safe_load((Path(__file__).parents[2] / "deploy" / "serve_config.yaml").read_text())
    (application,) = config["applications"]
    assert application["import_path"] == "audio8_coreai.server.ray_app:build_app"
    assert isinstance(build_app(application["args"]), serve.Application)
    with pytest.raises(pydantic.ValidationError, match="batchs"):
        build_app({**application["args"], "batchs": 8})  # a misspelt knob is an error, not a default
    with pytest.raises(pydantic.ValidationError, match="batchs"):
        build_app({**application["args"], "server": {"batchs": 8}})
    with pytest.raises(pydantic.ValidationError, match="replicas"):
        build_app({**application["args"], "replicas": 0})
    for name, instead in (("port", "http_options: port"), ("workers", "replicas (or autoscale) and server: batch")):
        with pytest.raises(ValueError, match=rf"server: {name} is Ray's under Ray Serve: set {re.escape(instead)}"):
            build_app({**application["args"], "server": {name: 9000}})  # it was ignored, silently


def test_ray_settings_and_the_cli_check_the_scale(tiny_checkpoint):
    from typer.testing import CliRunner

    from audio8_coreai.cli import app

    assert RaySettings(autoscale=(0, 4)).autoscale == (0, 4)
    for bad in ((3, 1), (0, 0), (-1, 2)):
        with pytest.raises(ValueError, match="autoscale"):
            RaySettings(autoscale=bad)
    for options, said in (
        (["--autoscale", "3:1"], "--autoscale must be min and max replicas, 0 <= min <= max"),
        (["--replica-gpus", "-1"], "--replica-gpus must be a finite number >= 0, got -1.0"),
        (["--autoscale", "two"], "--autoscale takes MIN:MAX"),
        (["--workers", "2"], "drop --workers"),
        (["--replicas", "0"], "--replicas must be >= 1"),
    ):
        result = CliRunner().invoke(app, ["serve", "--ray", "--model", str(tiny_checkpoint), *options])
        assert result.exit_code != 0 and said in result.output


def test_serve_on_ray_checks_a_local_checkpoint_and_the_voice_map_before_ray_starts(
    tiny_checkpoint, tmp_path, monkeypatch
):
    """They failed inside each replica, as pages of Ray's tracebacks; a hub id is left to the replicas to fetch."""
    from typer.testing import CliRunner

    from audio8_coreai.cli import app
    from audio8_coreai.server import ray_app

    started = []
    monkeypatch.setattr(ray_app, "run_on_ray", lambda cluster, server, address: started.append(cluster.model))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for options, said in (
        (["--model", str(tmp_path / "nowhere")], "no checkpoint folder at"),
        (["--model", str(tiny_checkpoint), "--voice-map", "alloy=ghost"], "--voice-map alloy=ghost: no voice named"),
    ):
        result = CliRunner().invoke(app, ["serve", "--ray", "--voices", str(tmp_path), *options])
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert started == []
    assert CliRunner().invoke(app, ["serve", "--ray", "--model", "owner/name"]).exit_code == 0
    assert started == ["owner/name"]
    cpus = len(os.sched_getaffinity(0))
    for options, said in (  # a new Ray instance here would leave them pending, saying so only in Ray's log
        (["--replicas", str(cpus + 1)], f"{cpus + 1} replica(s) need {cpus + 1} CPUs and 0 GPUs"),
        (["--autoscale", f"{cpus + 1}:{cpus + 2}"], f"{cpus + 1} replica(s) need {cpus + 1} CPUs"),
        (["--replica-gpus", "64"], "1 replica(s) need 1 CPUs and 64 GPUs"),
    ):
        result = CliRunner().invoke(app, ["serve", "--ray", "--model", "owner/name", "--device", "cpu", *options])
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert (
        CliRunner().invoke(app, ["serve", "--ray", "--model", "o/n", "--replicas", "9", "--address", "auto"]).exit_code
        == 0
    )
    assert started == ["owner/name", "o/n"]  # a cluster's resources are Ray's to tell
