"""THE baseline of the benchmark's ``vs_baseline`` ratio: the publisher's way of making a frame. A measuring
tool only, never a product path (the product's frame is the backend's)."""

from __future__ import annotations

import numpy as np


class BaselineFrame:
    """The benchmark's baseline, not a product path: the publisher's way of making a frame, on our fp32 modules:
    the slow step with the full-vocabulary head (155,776 rows: the tied embedding), logits to the host, NumPy
    sampling with the mask, then the fast AR's rows with each row's logits to the host and a NumPy draw. Only for
    the benchmark's side-by-side ratio."""

    def __init__(self, backend, params):
        self.backend, self.params = backend, params
        cfg = backend.cfg
        self.allowed = np.concatenate([np.arange(cfg.semantic_begin_id, cfg.semantic_end_id + 1), [cfg.eos_token_id]])

    def __call__(
        self, column: np.ndarray, pos: int, noise_slow: np.ndarray, window: np.ndarray, noise_fast: np.ndarray
    ) -> tuple[int, np.ndarray]:
        import torch

        from ...sampling_reference import np_sample_semantic, np_sample_top_k_top_p

        b, cfg, p = self.backend, self.backend.cfg, self.params
        model = b.model
        with torch.inference_mode():
            col = torch.as_tensor(column, dtype=torch.long).view(1, -1, 1)
            _, hidden = b.frame_maths.slow_step(col, pos, b.k_cache, b.v_cache)
            full = torch.nn.functional.linear(hidden, model.slow.embeddings.weight)[0].numpy()
        logits = full[self.allowed]  # the publisher masks every other id to -inf before sampling
        sem, _, _ = np_sample_semantic(logits, noise_slow, window, p, cfg.semantic_begin_id, cfg.eos_token_id)
        code = int(np.clip(int(sem) - cfg.semantic_begin_id, 0, cfg.codebook_size - 1))
        codes = [code]

        def draw(row: int, lg: torch.Tensor) -> torch.Tensor:  # each row's logits to the host, a NumPy draw
            codes.append(
                int(np_sample_top_k_top_p(lg[0].float().numpy(), noise_fast[row - 1], p.top_k, p.top_p, p.temperature))
            )
            return torch.tensor([codes[-1]])

        with torch.inference_mode():
            b.frame_maths.fast_rows(hidden, torch.tensor([code]), draw)
        return int(sem), np.asarray(codes, dtype=np.int64)
