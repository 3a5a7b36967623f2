"""The bounds of every size and number a checkpoint's configs may hold, checked before anything is allocated.

The highest values lie far above the publisher's 0.6b (in the comments) yet low enough that a mistyped or hostile
size is refused at once; the tensors' shapes are then checked against the sizes (checkpoint/validate.py).
"""

from __future__ import annotations

# config.json's sizes (lowest, highest).
MODEL_SIZE_LIMITS = {
    "vocab_size": (1, 1 << 20),  # 155776
    "dim": (1, 1 << 14),  # 896
    "n_layer": (1, 256),  # 24
    "n_head": (1, 256),  # 14
    "n_local_heads": (1, 256),  # 2
    "head_dim": (1, 1024),  # 64
    "intermediate_size": (1, 1 << 17),  # 4864
    "max_seq_len": (1, 1 << 15),  # 2048: the slow KV cache and RoPE table have this many positions
    "codebook_size": (1, 1 << 16),  # 4096
    "num_codebooks": (1, 64),  # 10
    "n_fast_layer": (1, 256),  # 4
    "fast_dim": (1, 1 << 14),  # 896
    "fast_n_head": (1, 256),  # 14
    "fast_n_local_heads": (1, 256),  # 2
    "fast_head_dim": (1, 1024),  # 64
    "fast_intermediate_size": (1, 1 << 17),  # 4864
    "ras_window_size": (1, 1 << 15),  # 10; at most max_seq_len too
    "codec_sample_rate": (8000, 192000),  # 44100 Hz; equal to the codec's (checked with the codec)
    "codec_frame_size": (1, 1 << 16),  # 2048 samples; equal to the codec's (checked with the codec)
}
# config.json's real numbers: the rule each must meet besides being finite.
MODEL_NUMBER_RULES = {
    "rope_base": ("above 1", lambda v: v > 1),  # 1e6
    "norm_eps": ("in (0, 1)", lambda v: 0 < v < 1),  # 1e-6
    "ras_temperature": ("above 0", lambda v: v > 0),  # 1.0
    "ras_top_p": ("in (0, 1]", lambda v: 0 < v <= 1),  # 0.9
}


# codec_spec.json's sizes (lowest, highest), as MODEL_SIZE_LIMITS; a list's bounds hold for each of its entries.
CODEC_SIZE_LIMITS = {
    "encoder_base_channels": (1, 1 << 12),  # 64
    "encoder_strides": (1, 64),  # 2, 4, 8, 8
    "encoder_transformer_layers": (0, 64),  # 0, 0, 0, 4
    "encoder_transformer_window": (1, 1 << 16),  # 512
    "encoder_transformer_intermediate_size": (1, 1 << 17),  # 3072
    "latent_dim": (1, 1 << 14),  # 1024
    "semantic_codebook_size": (1, 1 << 16),  # 4096
    "residual_codebooks": (1, 64),  # 9
    "residual_codebook_size": (1, 1 << 16),  # 1024
    "codebook_dim": (1, 1024),  # 8
    "decoder_channels": (1, 1 << 14),  # 1536
    "decoder_strides": (1, 64),  # 8, 8, 4, 2
    "sample_rate": (8000, 192000),  # 44100 Hz
    "head_dim": (1, 1024),  # 64
    "quantizer_transformer.n_layer": (1, 64),  # 8
    "quantizer_transformer.n_head": (1, 256),  # 16
    "quantizer_transformer.intermediate_size": (1, 1 << 17),  # 3072
    "quantizer_transformer.window_size": (1, 1 << 16),  # 128
}
MAX_CODEC_STRIDES = 8  # entries of encoder_strides and decoder_strides (4)


class LongNumber:
    """A JSON number of more digits than any config value has, kept in its place by the checkpoint reader (Python
    refuses to read one of over 4300 digits): every check then refuses it, naming its key."""

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"a {self.digits}-digit number"


MAX_CONFIG_BYTES = 1 << 20  # a config json file (the publisher's largest is 1.5 kB)
MAX_NUMBER_DIGITS = 100  # digits of a JSON integer read as a number; a longer one is read as a LongNumber
