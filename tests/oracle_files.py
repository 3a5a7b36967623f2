"""Where the oracle recordings live in the repository (tests/oracle) and how a codec file is written in the publisher's
format from them."""

from __future__ import annotations

import json
from pathlib import Path

ORACLE = Path(__file__).resolve().parent / "oracle"


def write_codec_pth(folder: Path) -> None:
    """Write ``folder/codec.pth`` (the publisher's format: ``torch.save`` of a plain dict of tensors) from
    ``folder/codec.safetensors``, its keys in the publisher's file order: the released 0.6b codec's
    (``param_shapes_0.6b.json``), of which the tiny codec's names are a subset (safetensors sorts its keys)."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(folder / "codec.safetensors")
    order = [name for name, _ in json.loads((ORACLE / "param_shapes_0.6b.json").read_text())["codec"]]
    ordered = {name: tensors[name] for name in order if name in tensors}
    assert ordered.keys() == tensors.keys(), "codec.safetensors holds names the 0.6b codec does not"
    torch.save(ordered, folder / "codec.pth")
