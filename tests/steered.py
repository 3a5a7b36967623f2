"""Checkpoints whose eos decision is fixed by construction, for tests about what happens at eos or at the frame
cap: what a random checkpoint happens to draw for one seed is no such construction.

Both edit a copy of a checkpoint folder in the publisher's layout (tied head: the compact head's rows are
``embeddings.weight`` rows ``semantic_begin_id..semantic_end_id`` and then ``eos_token_id``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

# Semantic logits reach at least this while eos's is 0 (see steer_eos): its probability is below e^-50.
NEVER_EOS_SCALE = 50.0


def steer_eos(source: Path, dest: Path, eos: str, max_seq_len: int | None = None) -> Path:
    """Copy the checkpoint folder ``source`` to ``dest`` with the slow AR's eos decision fixed; returns ``dest``.

    ``eos="first"``: the final norm's weight is 0, so the post-norm hidden and every compact logit are exactly 0.
    On equal logits eos (id 2 of the tiny vocabulary) sorts before the semantic ids (the publisher's vocabulary
    order, tests/test_sampling.py), so with top-k 1 every utterance draws eos on its first frame.
    ``eos="never"``: the final norm's weight is 1 and the head's semantic rows are +-NEVER_EOS_SCALE times the unit
    vectors (2 * dim of them; the other semantic rows and eos's row are 0). The post-norm hidden h has
    mean(h^2) = mean(x^2) / (mean(x^2) + eps), about 1, so max|h_i| >= ~1 and the best semantic logit is about
    NEVER_EOS_SCALE or more while eos's is 0: no draw (any seed, temperature, top-k, top-p or RAS) reaches eos.
    ``max_seq_len`` replaces the context (prompt + frames) in ``config.json``.
    """
    shutil.copytree(source, dest)
    config_file = dest / "config.json"
    config = json.loads(config_file.read_text())
    if max_seq_len is not None:
        config["max_seq_len"] = max_seq_len
        if "max_position_embeddings" in config:  # the HF alias of the same number
            config["max_position_embeddings"] = max_seq_len
        config_file.write_text(json.dumps(config, indent=2) + "\n")
    if config.get("tie_word_embeddings", True) is not True:
        raise ValueError("steer_eos edits the tied head (embeddings.weight)")
    weights = dest / "model.safetensors"
    with safe_open(weights, "pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    norm, table = tensors["norm.weight"], tensors["embeddings.weight"]
    begin, end, eos_id, dim = (config[k] for k in ("semantic_begin_id", "semantic_end_id", "eos_token_id", "dim"))
    if eos == "first":
        norm.zero_()
    elif eos == "never":
        if 2 * dim > end + 1 - begin:
            raise ValueError(f"{end + 1 - begin} semantic rows cannot hold +- the {dim} unit vectors")
        norm.fill_(1.0)
        table[begin : end + 1] = 0
        unit = NEVER_EOS_SCALE * torch.eye(dim, dtype=table.dtype)
        table[begin : begin + 2 * dim] = torch.cat([unit, -unit])
        table[eos_id] = 0
    else:
        raise ValueError(f"eos must be 'first' or 'never', not {eos!r}")
    save_file(tensors, weights, metadata=metadata)
    return dest
