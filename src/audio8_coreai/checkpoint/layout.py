"""The publisher's checkpoint folder layout (SPEC.md sections 1 and 3) and the error for a folder that breaks it.

* ``config.json``: the ``ArkttsConfig`` (``model_type`` ``arktts``), read into :class:`ModelConfig`;
* ``generation_config.json`` (optional): sampling defaults, the publisher's fallbacks when absent;
* ``model.safetensors``: the DualAR weights under the publisher's names (bf16 in the release);
* ``codec.pth``: the codec weights, a torch pickle loaded with ``weights_only=True`` only, or
  ``codec.safetensors`` with the same names (preferred when present: no pickle at all);
* ``codec_spec.json`` (optional, not in the release): the codec's sizes when they are not the 0.6b ones;
* ``tokenizer.json``: the prompt builder's (needed to speak; not to validate or convert weights);
  ``tokenizer_config.json`` is fetched and written beside it, not read.
"""

from __future__ import annotations

from ..config import ModelConfig

DEFAULT_MODEL = "Audio8/Audio8-TTS-Preview-0.6b"

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
MODEL_FILE = "model.safetensors"
CODEC_SAFETENSORS_FILE = "codec.safetensors"
CODEC_SPEC_FILE = "codec_spec.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# What a folder must hold, said the same way in every error message.
FOLDER_CONTENTS = (
    "config.json, model.safetensors, codec.pth (or codec.safetensors) and tokenizer.json; "
    "generation_config.json is used when present"
)


def checkpoint_files(weights: bool = True, codec: bool = True) -> list[str]:
    """The names of every file a checkpoint folder may hold (the hub download's allow-list); the model's weights
    only with ``weights``, the codec's (pickle or safetensors) only with ``codec``."""
    files = [CONFIG_FILE, GENERATION_FILE, CODEC_SPEC_FILE, *TOKENIZER_FILES]
    if weights:
        files.append(MODEL_FILE)
    if codec:
        files += [ModelConfig.__dataclass_fields__["codec_filename"].default, CODEC_SAFETENSORS_FILE]
    return files
