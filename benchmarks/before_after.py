"""Frame time of two source trees of this package side by side: a change's cost, measured, not assumed.

    python benchmarks/before_after.py --before OLD/src --after src --model DIR [--precision int16 ...]
                                      [--frames 32] [--rounds 5] [--threads 1]

Both trees cannot live in one process (same package name), so each round runs one short process per tree and
precision, alternating, on the same checkpoint, prompt and seed (the same draws, so the same frames): each process
loads ``TTS``, makes one warm-up utterance, then times ``generate``. Reported: the median ms per frame and ms per
prompt column of each, the ratio after/before, and the load average before and after the run (the machine is
shared: trust the ratio over the absolute times). Only the public API is used, so any two revisions compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from audio8_coreai.measure.args import count

TEXT = "The meeting has been moved to Thursday afternoon, so please update your calendars and let everyone know."

SNIPPET = """
import json, sys, torch
from audio8_coreai import TTS
model, precision, frames, threads, text = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
tts = TTS.load(model, device="cpu", precision=precision)
tts.generate(text, seed=0, max_frames=frames)  # warm-up; the prompt's head is kept from here on
out = tts.generate(text, seed=0, max_frames=frames)
print(json.dumps({"ms_per_frame": 1e3 * out.frames_s / max(out.frames, 1), "frames": out.frames,
                  "prefill_ms": 1e3 * out.prefill_s}))
"""


def run(src: Path, model: str, precision: str, frames: int, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src.resolve()), "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, "-c", SNIPPET, model, precision, str(frames), str(threads), TEXT],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the src/ folder of the old tree")
    ap.add_argument("--after", type=Path, default=Path("src"), help="the src/ folder of the new tree")
    ap.add_argument("--model", required=True, help="checkpoint folder (audio8 make-checkpoint --size 0.6b)")
    ap.add_argument("--precision", action="append", help="repeatable; default int16 and fp32")
    ap.add_argument("--frames", type=count, default=32)
    ap.add_argument("--rounds", type=count, default=5)
    ap.add_argument("--threads", type=count, default=1)
    args = ap.parse_args()
    for src in (args.before, args.after):  # else the child would import whatever audio8_coreai is installed
        if not (src / "audio8_coreai" / "__init__.py").is_file():
            ap.error(f"{src} holds no audio8_coreai package: give a tree's src/ folder")
    load0 = os.getloadavg()
    samples: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for precision in args.precision or ["int16", "fp32"]:
            for name, src in (("before", args.before), ("after", args.after)):
                res = run(src, args.model, precision, args.frames, args.threads)
                samples.setdefault((precision, name), []).append(res)
                print(
                    f"round {r} {precision} {name}: {res['ms_per_frame']:.1f} ms/frame ({res['frames']} frames)",
                    flush=True,
                )
    print(f"load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    for precision in args.precision or ["int16", "fp32"]:
        med = {
            name: statistics.median(s["ms_per_frame"] for s in samples[(precision, name)])
            for name in ("before", "after")
        }
        frames = {s["frames"] for name in ("before", "after") for s in samples[(precision, name)]}
        print(
            f"{precision}: before {med['before']:.1f} ms/frame, after {med['after']:.1f} ms/frame, "
            f"after/before {med['after'] / med['before']:.3f} (frames per run {sorted(frames)})"
        )


if __name__ == "__main__":
    main()
