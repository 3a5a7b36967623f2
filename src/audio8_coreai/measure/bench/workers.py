"""The benchmark's subprocesses: the side-by-side group and each configuration's RSS run in their own
interpreter (``python -m audio8_coreai.measure.bench``), and the random 0.6b checkpoint they load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ...errors import Audio8Error, ConfigError
from ...settings import DEFAULTS, BenchSettings
from .config import label
from .run import measure, measure_group, measure_rss

_REFUSED = 3  # the worker's exit status for a configuration it refused, its reason said in one line


def ensure_checkpoint(path: Path, log=print) -> Path:
    """``path`` when it is a checkpoint folder; the bench's own random 0.6b checkpoint (``DEFAULTS.bench.checkpoint``)
    is written there (seed 0, about 2.8 GB) when absent or empty.

    Raises CheckpointError for a file, or for any other folder that is absent or empty: a mistyped ``--model`` must
    not fill a new folder with gigabytes of random weights (``audio8 make-checkpoint DIR --size 0.6b`` makes one).
    """
    from ...checkpoint import make_checkpoint
    from ...errors import CheckpointError

    path = path.expanduser()
    if path.is_dir() and any(path.iterdir()):
        return path
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path} is a file: give a checkpoint folder")
    default = Path(DEFAULTS.bench.checkpoint).expanduser()
    if path.absolute() != default.absolute():
        raise CheckpointError(
            f"no checkpoint in {path} ({'an empty folder' if path.is_dir() else 'no such folder'}): give a "
            f"checkpoint folder, make a random one there (audio8 make-checkpoint {path} --size 0.6b), or leave "
            f"the option out for the bench's own random 0.6b checkpoint in {default}"
        )
    log(f"making the random 0.6b checkpoint in {path} (about 2.8 GB, a minute or more)...")
    make_checkpoint(path, "0.6b", seed=0)
    return path


def _worker(mode: str, payload) -> list | dict:
    proc = subprocess.run(
        [sys.executable, "-m", "audio8_coreai.measure.bench", mode, json.dumps(payload)],
        stdout=subprocess.PIPE,
        text=True,
    )
    if proc.returncode == _REFUSED:
        raise ConfigError(f"the bench worker ({mode}) stopped: the reason is above")
    if proc.returncode:
        raise RuntimeError(f"the bench worker ({mode}) failed (exit status {proc.returncode}); its error is above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_configs(configs: list[BenchSettings], log=print, rss: bool = True) -> list[dict]:
    """Time ``configs`` side by side in one subprocess (:func:`measure_group`), then (``rss``) measure each
    one's peak RSS alone in its own subprocess (:func:`measure_rss`)."""
    log(f"measuring {', '.join(label(c) for c in configs)} side by side...")
    rows = _worker("--group", [c.model_dump() for c in configs])
    if rss:
        for c, row in zip(configs, rows):
            log(f"peak RSS of {label(c)} alone...")
            row.update(_worker("--rss", c.model_dump()))
    return rows


def main(argv: list[str] | None = None) -> None:
    """The worker: one mode's figures as a JSON line on stdout. An Audio8Error (a configuration the checkpoint
    cannot run) is said on stderr in one line, exit status ``_REFUSED``; anything else is a traceback."""
    try:
        _main(argv)
    except Audio8Error as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(_REFUSED) from None


def _main(argv: list[str] | None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--group":
        print(json.dumps(measure_group([BenchSettings(**c) for c in json.loads(argv[1])])))
    elif len(argv) == 2 and argv[0] == "--rss":
        print(json.dumps(measure_rss(BenchSettings(**json.loads(argv[1])))))
    elif len(argv) == 2 and argv[0] == "--worker":
        print(json.dumps(measure(BenchSettings(**json.loads(argv[1])))))
    else:
        raise SystemExit(
            "usage: python -m audio8_coreai.measure.bench --group|--rss|--worker JSON (use `audio8 bench`)"
        )
