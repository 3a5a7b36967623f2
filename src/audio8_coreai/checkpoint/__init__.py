"""Checkpoints in the publisher's folder layout: find (folder or hub id), validate before any allocation, load
weights safely, write random ones for tests and benchmarks."""

from ..errors import CheckpointError
from .layout import CODEC_SPEC_FILE, CONFIG_FILE, DEFAULT_MODEL, GENERATION_FILE, MODEL_FILE
from .load import Checkpoint, load_checkpoint
from .locate import is_hub_id, resolve_checkpoint
from .random import make_checkpoint
from .validate import damaged, derive_codec_config, require_finite

__all__ = [
    "CODEC_SPEC_FILE",
    "CONFIG_FILE",
    "DEFAULT_MODEL",
    "GENERATION_FILE",
    "MODEL_FILE",
    "Checkpoint",
    "CheckpointError",
    "damaged",
    "derive_codec_config",
    "is_hub_id",
    "load_checkpoint",
    "make_checkpoint",
    "require_finite",
    "resolve_checkpoint",
]
