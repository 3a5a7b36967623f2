"""Peak RSS of the default load, a short generate and a streamed decode, one fresh process per precision.

    python benchmarks/peak_rss.py --model DIR [--precision fp16w --precision int16] [--frames 32]
                                  [--codec-process auto|on|off] [--json out.json]

Each precision runs in a subprocess of its own (a fresh process: nothing of another run is resident). The
subprocess loads ``TTS.load(model, device="cpu", precision=P)``, then runs ``generate`` for ``--frames`` frames and
a ``stream`` of the same text for ``--frames`` frames, printing after each step the process's resident memory now
(``VmRSS``) and its peak so far (``VmHWM``, which is ``ru_maxrss``), and, when the codec runs in a process of its
own, that child's (``/proc/PID/status`` of the codec process). GB are 1e9 bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time

from audio8_coreai.measure.args import count

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs back home before the rain."


def _status(pid: int | str = "self") -> dict[str, float]:
    """VmRSS and VmHWM of ``pid`` in GB (1e9 bytes); empty when the process is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024 / 1e9
    except OSError:
        pass
    return out


def _child(model: str, precision: str, frames: int, codec_process: bool | None) -> None:
    """One fresh process: load, generate, stream; one JSON line per step on stdout."""
    import numpy as np

    from audio8_coreai import TTS

    def report(step: str, tts=None) -> None:
        row = {"step": step, "s": round(time.perf_counter() - t0, 1), **_status()}
        pid = None if tts is None else tts.backend.codec_process_pid
        if pid is not None:
            codec = _status(pid)
            row.update(codec_rss=codec.get("VmRSS"), codec_hwm=codec.get("VmHWM"))
        print(json.dumps(row), flush=True)

    t0 = time.perf_counter()
    report("start")
    tts = TTS.load(model, device="cpu", precision=precision, codec_process=codec_process)
    report("load", tts)
    audio = tts.generate(TEXT, seed=0, max_frames=frames)
    report("generate", tts)
    chunks = list(tts.stream(TEXT, seed=0, max_frames=frames))
    report("stream", tts)
    digest = {
        "codes_sha256": hashlib.sha256(np.ascontiguousarray(audio.codes, dtype=np.int64).tobytes()).hexdigest()[:16],
        "audio_sha256": hashlib.sha256(np.ascontiguousarray(audio.audio, dtype=np.float32).tobytes()).hexdigest()[:16],
        "stream_sha256": hashlib.sha256(np.concatenate(chunks).astype(np.float32).tobytes()).hexdigest()[:16],
    }
    print(json.dumps({"step": "done", "frames": int(audio.codes.shape[1]), **digest}), flush=True)
    tts.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint folder (publisher layout)")
    parser.add_argument("--precision", action="append", help="precision to measure (repeatable; default fp16w)")
    parser.add_argument("--frames", type=count, default=32, help="frames to generate and to stream")
    parser.add_argument("--codec-process", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--json", help="write every step of every precision here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    codec = {"auto": None, "on": True, "off": False}[args.codec_process]
    precisions = args.precision or ["fp16w"]
    if args.child:
        _child(args.model, precisions[0], args.frames, codec)
        return
    results = {}
    for p in precisions:
        cmd = [sys.executable, __file__, "--child", "--model", args.model, "--precision", p]
        cmd += ["--frames", str(args.frames), "--codec-process", args.codec_process]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # its stderr (an error) is the user's to read
        if done.returncode:
            sys.exit(f"the {p} run failed (exit status {done.returncode}); its error is above")
        out = done.stdout
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        results[p] = rows
        print(f"{p}:")
        for r in rows:
            if r["step"] == "done":  # what was made, to compare precisions' audio (same digests: same samples)
                print(f"  made {r['frames']} frames: audio {r['audio_sha256']}, stream {r['stream_sha256']} (SHA-256)")
                continue
            codec_part = (
                ""
                if r.get("codec_hwm") is None
                else (
                    f"   codec process: now {r['codec_rss']:.2f} GB, peak {r['codec_hwm']:.2f} GB; whole: now "
                    f"{r['VmRSS'] + r['codec_rss']:.2f} GB, peaks summed {r['VmHWM'] + r['codec_hwm']:.2f} GB"
                )
            )
            step = f"after {r['step']:<9} ({r['s']:6.1f} s)"
            print(f"  {step} now {r['VmRSS']:.2f} GB, peak {r['VmHWM']:.2f} GB{codec_part}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
