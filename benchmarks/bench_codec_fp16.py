"""The fp16 codec decoder asset against the fp32 incremental decoder, beside other fp16 decodes of the same codes.

    python benchmarks/bench_codec_fp16.py --model DIR [--assets DIR] [--pushes 1,16] [--first-frames 1] [--stateless]

Without ``--assets`` the checkpoint's codec decoder is converted at fp16 (only that part, with the 1-frame function
``first`` unless ``--first-frames 0``) into a temporary folder; with it, that folder's ``codec_decoder.aimodel`` is
used (converted from ``--model`` at fp16). Seeded random codes (``default_rng(0).integers(0, 1024, (10, 64))``, the
first frames; the graph clamps) are pushed ``--pushes`` frames at a time through:

* the asset: each push one call of its shortest function holding it (``first``: 1 frame, ``main``: its push,
  padded), the decoder state carried between calls as Core AI state, as the backend's codec stream does;
* with ``--stateless``, a stateless fp16 asset (``CodecDecoder.forward`` over all the pushes' frames in one call,
  the form of the format-1 decoder asset), converted here, its audio cut at the pushes' frames;
* torch, incremental (``StreamingDecoder``), fp32 arithmetic: the reference; on float16-rounded weights (the share
  of weight rounding); and on those weights with every layer's output rounded to float16 too (float16 storage
  of weights and activations, float32 arithmetic inside each op), incremental and whole-utterance (stateless).

Each push of each decode prints its waveform cosine and max |diff| to the fp32 reference, and the assets' call
times (on Linux the coreai.runtime CPU interpreter: slow, it proves an asset right; a 0.6b 16-frame call takes
minutes). PyTorch's float16 CPU kernels are too slow here for a float16-arithmetic torch row.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from audio8_coreai.backends.coreai import convert, read_manifest
from audio8_coreai.backends.coreai.export import export_program
from audio8_coreai.backends.coreai.weights import decoder_module
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.measure.args import count, count_or_zero
from audio8_coreai.model.codec import CodecDecoder, StreamingDecoder


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def torch_incremental(decoder: CodecDecoder, codes: np.ndarray, pushes: list[int]) -> list[np.ndarray]:
    """Each push's audio (float32 [n * 2048]) from the torch incremental decoder."""
    stream, out, first = StreamingDecoder(decoder), [], 0
    with torch.no_grad():
        for n in pushes:
            out.append(stream.push(torch.as_tensor(codes[:, first : first + n])[None])[0].numpy())
            first += n
    return out


def torch_whole(decoder: CodecDecoder, codes: np.ndarray, pushes: list[int]) -> list[np.ndarray]:
    """The whole-utterance decode, cut at the pushes' frames."""
    with torch.no_grad():
        wav = decoder(torch.as_tensor(codes)[None])[0].float().numpy()
    bounds = np.cumsum([0, *pushes]) * decoder.cfg.frame_length
    return [wav[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


async def asset_pushes(
    path: Path, codes: np.ndarray, pushes: list[int], hop: int
) -> tuple[list[np.ndarray], list[float]]:
    """Each push's audio from the decoder asset (manifest.py's contract) and each call's seconds."""
    import coreai.runtime as rt
    from coreai.authoring import AIModelAsset

    manifest = read_manifest(path)
    state = {k: rt.NDArray(np.zeros(s["shape"], s["dtype"])) for k, s in manifest["contract"]["main"]["states"].items()}
    out, times, first = [], [], 0
    async with AIModelAsset.load(path).executable() as model:
        fns = sorted((size, model.load_function(name)) for name, size in manifest["pushes"].items())
        for n in pushes:
            size, fn = next((size, fn) for size, fn in fns if size >= n)  # a push holds at most the main push
            padded = np.zeros((1, codes.shape[0], size), np.int32)
            padded[0, :, :n] = codes[:, first : first + n]
            inputs = {
                "codes": rt.NDArray(padded),
                "start": rt.NDArray(np.array([first], np.int32)),
                "count": rt.NDArray(np.array([n], np.int32)),
            }
            t0 = time.perf_counter()
            wav = (await fn(inputs=inputs, state=state))["wav"].numpy()[0, : n * hop].copy()
            times.append(time.perf_counter() - t0)
            out.append(wav)
            first += n
    return out, times


def stateless_asset(cc, state, codes: np.ndarray, pushes: list[int], folder: Path) -> tuple[list[np.ndarray], float]:
    """Convert ``CodecDecoder.forward`` at fp16 for all the pushes' frames, run it once on ``codes``: the audio cut
    at the pushes' frames, and the call's seconds."""
    import coreai.runtime as rt
    import coreai_torch
    from coreai.authoring import AIModelAsset

    class Whole(torch.nn.Module):
        def __init__(self, decoder: CodecDecoder):
            super().__init__()
            self.decoder = decoder

        def forward(self, codes: torch.Tensor) -> torch.Tensor:
            return self.decoder(codes.long()).float()

    frames = sum(pushes)
    converter = coreai_torch.TorchConverter(mode=coreai_torch.TorchConverter.Mode.RELEASE)
    example = (torch.zeros(1, codes.shape[0], frames, dtype=torch.int32),)
    program = export_program(Whole(decoder_module(cc, state, "fp16", frames)).eval(), example)
    converter.add_exported_program(program, input_names=["codes"], output_names=["wav"], entrypoint_name="main")
    path = converter.to_coreai().save_asset(folder / "stateless.aimodel").path

    async def run() -> tuple[np.ndarray, float]:
        async with AIModelAsset.load(path).executable() as model:
            t0 = time.perf_counter()
            out = await model.load_function("main")(inputs={"codes": rt.NDArray(codes[None].astype(np.int32))})
            return out["wav"].numpy()[0].copy(), time.perf_counter() - t0

    wav, seconds = asyncio.run(run())
    bounds = np.cumsum([0, *pushes]) * cc.frame_length
    return [wav[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)], seconds


def rounded_outputs(module: torch.nn.Module) -> None:
    """Round every leaf module's floating output to float16 (kept float32): float16 activations, float32 arithmetic."""
    for m in module.modules():
        if not list(m.children()):
            m.register_forward_hook(lambda mod, i, out: out.half().float() if out.is_floating_point() else out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint folder")
    ap.add_argument("--assets", help="a folder holding codec_decoder.aimodel (fp16) of --model (skips conversion)")
    ap.add_argument("--pushes", default="1,16", help="frames per push, comma-separated (each at most the push)")
    ap.add_argument("--first-frames", type=count_or_zero, default=1, help="the converted asset's first push (0: none)")
    ap.add_argument("--stateless", action="store_true", help="also convert and run a stateless fp16 decoder asset")
    ap.add_argument("--threads", type=count, default=1, help="torch CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pushes = [int(n) for n in args.pushes.split(",")]
    ckpt = load_checkpoint(args.model)
    cc, state = ckpt.codec_config, ckpt.codec_state_dict()
    drawn = (cc.num_codebooks, max(64, sum(pushes)))  # 64 frames at least: runs of a few pushes share their codes
    codes = np.random.default_rng(0).integers(0, 1024, size=drawn)[:, : sum(pushes)]
    decodes, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.assets) if args.assets else Path(tmp) / "assets"
        if not args.assets:
            t0 = time.perf_counter()
            convert(
                ckpt, folder, "fp16", decoder_first_frames=args.first_frames, parts=("codec_decoder",), progress=False
            )
            print(f"conversion (fp16 codec_decoder): {time.perf_counter() - t0:.0f} s")
        path = folder / "codec_decoder.aimodel"
        manifest = read_manifest(path)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        states = manifest["contract"]["main"]["states"].values()
        state_mb = sum(np.prod(s["shape"]) * np.dtype(s["dtype"]).itemsize for s in states) / 1e6
        print(
            f"asset codec_decoder.aimodel ({manifest['precision']}, pushes {manifest['pushes']}): {size / 1e6:.1f} MB"
        )
        print(f"decoder state: {len(manifest['state'])} tensors, {state_mb:.1f} MB")
        decodes["asset fp16, state carried"], times = asyncio.run(asset_pushes(path, codes, pushes, cc.frame_length))
        seconds["stateful asset"] = " + ".join(f"{t:.0f}" for t in times)
        if args.stateless:
            decodes["asset fp16, stateless"], t = stateless_asset(cc, state, codes, pushes, Path(tmp))
            seconds["stateless asset"] = f"{t:.0f}"

    def decoder(round_weights: bool = False) -> CodecDecoder:
        dec = CodecDecoder.from_state_dict(cc, state, torch.float32, max_frames=sum(pushes) + 1).eval()
        with torch.no_grad():
            for p in dec.parameters() if round_weights else ():
                p.copy_(p.half().float())
        return dec

    reference = torch_incremental(decoder(), codes, pushes)
    decodes["torch, fp16 weights"] = torch_incremental(decoder(True), codes, pushes)
    storage = decoder(True)
    rounded_outputs(storage)
    decodes["torch, fp16 weights+activations"] = torch_incremental(storage, codes, pushes)
    decodes["  the same, whole (stateless)"] = torch_whole(storage, codes, pushes)
    print(f"pushes {pushes}: cos / max|diff| against the torch fp32 incremental decoder, push by push")
    for name, chunks in decodes.items():
        cells = [f"{cosine(c, r):.7f} / {np.abs(c - r).max():.1e}" for c, r in zip(chunks, reference, strict=True)]
        print(f"  {name:34s} " + " | ".join(cells))
    print("interpreter seconds per call: " + "; ".join(f"{k} {v}" for k, v in seconds.items()))


if __name__ == "__main__":
    main()
