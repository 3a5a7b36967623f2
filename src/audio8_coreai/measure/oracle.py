"""The oracle's ``fixture.npz`` (recorded from the publisher's code, see ``tests/oracle/README.md``): reading it, and
the recorded uniforms, sampling settings, forced columns and prompts its scenarios are replayed with.

Arrays are keyed ``SCENARIO__NAME`` (the oracle's layout); :func:`.gate.tensors.record_run` writes a reference run
in the same layout.
"""

from __future__ import annotations

import filecmp
import json
import zipfile
from pathlib import Path

import numpy as np

from ..backends.base import Backend
from ..config import ModelConfig, SamplingParams
from ..errors import ParityError
from .replay import RecordedNoise


def load_fixture(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """Read ``fixture.npz`` -> (arrays by key, meta dict). Raises ParityError with what to do."""
    path = Path(path)
    if path.is_dir():
        hint = f": give {path / 'fixture.npz'}" if (path / "fixture.npz").is_file() else ""
        raise ParityError(f"{path} is a folder, not a fixture file (an oracle folder's fixture.npz){hint}")
    if not path.is_file():
        raise ParityError(f"fixture not found: {path} (give the fixture.npz of an oracle folder)")
    if not zipfile.is_zipfile(path):  # np.load would try it as a pickle and say so
        raise ParityError(
            f"{path} is not an oracle fixture (a .npz archive, such as the fixture.npz of an oracle folder)"
        )
    try:
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as e:  # a corrupt npz raises zipfile/pickle/value errors alike
        raise ParityError(f"cannot read fixture {path}: {e}") from e
    if "meta_json" not in arrays:
        raise ParityError(
            f"{path} is not an oracle fixture: it has no meta_json (its arrays: "
            f"{', '.join(sorted(arrays)[:5]) or 'none'})"
        )
    try:
        meta = json.loads(str(arrays["meta_json"]))
    except ValueError as e:
        raise ParityError(f"cannot read fixture {path}: its meta_json is not JSON ({e})") from e
    return arrays, meta


def recorded_from_another(fixture_path: str | Path, model_file: str | Path) -> Path | None:
    """The oracle folder of ``fixture_path`` when it holds the ``model.safetensors`` the fixture was recorded from
    and that file's bytes differ from ``model_file`` (a run against the wrong weights); else None."""
    folder = Path(fixture_path).parent
    recorded = folder / "model.safetensors"
    if not recorded.is_file() or filecmp.cmp(recorded, model_file, shallow=False):
        return None
    return folder


def recorded_noise(fx: dict[str, np.ndarray], sc: str, item: int, steps: int, cfg: ModelConfig) -> RecordedNoise:
    """The recorded uniforms of scenario ``sc``'s batch ``item`` for ``steps`` steps (neutral 0.5 where nothing
    was recorded: greedy scenarios, or past the recording's end)."""
    shapes = ((2, cfg.num_semantic + 1), (cfg.num_codebooks - 1, cfg.codebook_size))
    noise = [_step_noise(fx, sc, s, item, shapes) for s in range(steps)]
    return RecordedNoise(np.stack([n[0] for n in noise]), np.stack([n[1] for n in noise]))


def _step_noise(fx, sc, s, b, shapes):
    key = f"{sc}__sem_regular_uniform_compact"
    if key not in fx or s >= fx[key].shape[0]:  # greedy draws ignore noise; past the recording: neutral
        return np.full(shapes[0], 0.5, np.float32), np.full(shapes[1], 0.5, np.float32)
    slow = np.stack([fx[key][s, b], fx[f"{sc}__sem_ras_uniform_compact"][s, b]])
    return slow.astype(np.float32), fx[f"{sc}__fast_uniform"][s, :, b].astype(np.float32)


def _params(meta: dict, sc: str, backend: Backend) -> SamplingParams:
    info = meta["scenarios"][sc]
    extra = info.get("extra", {})
    cfg = backend.cfg
    return SamplingParams(
        temperature=extra.get("temperature", 0.7),
        top_k=extra.get("top_k", 50),
        top_p=extra.get("top_p", 0.9),
        do_sample=info["do_sample"],
        ras_temperature=cfg.ras_temperature,
        ras_top_p=cfg.ras_top_p,
    )


def _forced(fx, sc, s, b) -> np.ndarray:
    return np.concatenate([[fx[f"{sc}__semantic"][s, b]], fx[f"{sc}__codebooks"][s, b]]).astype(np.int64)


def _item_prompt(fx: dict, sc: str, item: int | None) -> np.ndarray:
    """The prompt int [1+C, P] of a batch-1 scenario, or batch ``item``'s without its left padding."""
    prompt = fx[f"{sc}__prompt_input_ids"][item or 0]
    return prompt if item is None else prompt[:, fx[f"{sc}__prompt_attention_mask"][item].astype(bool)]
