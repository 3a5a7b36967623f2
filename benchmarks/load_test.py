"""Load test for `audio8 serve`: N concurrent clients for a bounded time; latency percentiles, TTFA, failures.

    python benchmarks/load_test.py --url http://127.0.0.1:8000 [--clients 4] [--duration 30] ...
    python benchmarks/load_test.py --model CHECKPOINT [--workers 2 | --batch 4] [--precision P] ...   # own server

Each client sends ``POST /v1/audio/speech`` again and again (streamed by default) until ``--duration`` seconds
have passed, then finishes its request in flight. Per request: **TTFA** (time to the first audio bytes),
**latency** (time to the last byte) and the audio seconds received. Printed: requests, failures (any status but
200, a transport error or an empty body; a 503 from a full queue counts too), p50/p90/p99/max of latency and
TTFA, audio seconds per wall second. Exits 1 when any request failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import numpy as np

TEXTS = [
    "The meeting has been moved to Thursday afternoon.",
    "Please remember to bring the signed forms with you.",
    "The train to the airport leaves every twenty minutes.",
    "今天的天气很好，我们去公园散步吧。",
]


@dataclass
class Tally:
    latency_s: list[float] = field(default_factory=list)
    ttfa_s: list[float] = field(default_factory=list)
    audio_s: float = 0.0
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def one_request(client: httpx.Client, url: str, body: dict, tally: Tally) -> None:
    t0 = time.perf_counter()
    first = None
    size = 0
    try:
        with client.stream("POST", f"{url}/v1/audio/speech", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            for data in r.iter_bytes():
                if first is None and data:
                    first = time.perf_counter() - t0
                size += len(data)
        if not size:
            raise RuntimeError("empty body")
    except Exception as e:  # every way a request can go wrong is a failure to report
        with tally.lock:
            tally.failures.append(f"{type(e).__name__}: {e}")
        return
    with tally.lock:
        tally.latency_s.append(time.perf_counter() - t0)
        tally.ttfa_s.append(first)
        tally.audio_s += size / 2 / 44100  # pcm: 16-bit mono at 44.1 kHz


def client_loop(index: int, url: str, args: argparse.Namespace, deadline: float, tally: Tally) -> None:
    with httpx.Client(timeout=args.timeout) as client:
        n = 0
        while time.monotonic() < deadline:
            body = {
                "model": "tts-1",
                "input": TEXTS[(index + n) % len(TEXTS)],
                "response_format": "pcm",
                "sample_rate": 44100,  # the model's rate: no resampling in the measurement
                "stream": not args.no_stream,
                "seed": index * 1000 + n,
                "max_frames": args.max_frames,
            }
            one_request(client, url, body, tally)
            n += 1


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    p = np.percentile(values, [50, 90, 99])
    return f"p50 {p[0]:.3f}  p90 {p[1]:.3f}  p99 {p[2]:.3f}  max {max(values):.3f} s"


def make_app(args: argparse.Namespace):
    """The app of ``audio8 serve`` for ``--model`` with ``--workers``/``--batch``."""
    from audio8_coreai import TTS
    from audio8_coreai.server import ServerSettings, create_app

    instances = 1 if args.batch else args.workers
    instances = [
        TTS.load(args.model, device=args.device, dtype=args.dtype, precision=args.precision) for _ in range(instances)
    ]
    if args.batch:
        _, instances = instances[0].batched(args.batch)
    settings = ServerSettings(workers=len(instances), max_queue=max(args.clients, 1), chunk_frames=args.chunk_frames)
    return create_app(instances, settings)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="A running server, e.g. http://127.0.0.1:8000.")
    where.add_argument("--model", help="Start a server on this checkpoint in this process.")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--duration", type=float, default=30.0, help="Seconds of sending new requests.")
    ap.add_argument("--max-frames", type=int, default=64, help="Frame cap per request (46 ms each).")
    ap.add_argument("--no-stream", action="store_true", help="Whole responses instead of streamed ones.")
    ap.add_argument("--timeout", type=float, default=600.0, help="Per-request timeout, seconds.")
    ap.add_argument("--workers", type=int, default=1, help="With --model: model instances.")
    ap.add_argument(
        "--batch",
        type=int,
        default=0,
        help="With --model: N rows of one model instance, frames batched (audio8 serve --batch).",
    )
    ap.add_argument("--precision", default=None, help="With --model: torch precision (default: the CPU default).")
    ap.add_argument("--chunk-frames", type=int, default=16, help="With --model: frames per streamed chunk.")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--json", help="Also write the figures here.")
    args = ap.parse_args()

    with contextlib.ExitStack() as stack:
        url = args.url
        if args.model:
            from audio8_coreai.server import serve_in_thread

            url = stack.enter_context(serve_in_thread(make_app(args)))
        health = httpx.get(f"{url}/health", timeout=30).json()
        tally = Tally()
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.clients) as pool:
            for i in range(args.clients):
                pool.submit(client_loop, i, url, args, t0 + args.duration, tally)
        wall = time.monotonic() - t0

    done = len(tally.latency_s)
    print(f"server: {health['backend']} on {health['device']}, {health['workers']} worker(s)")
    print(
        f"{args.clients} clients for {args.duration:g} s ({wall:.1f} s with the last requests), "
        f"{'whole' if args.no_stream else 'streamed'} pcm, max {args.max_frames} frames"
    )
    print(f"requests  {done} ok, {len(tally.failures)} failed")
    print(f"latency   {percentiles(tally.latency_s)}")
    print(f"TTFA      {percentiles(tally.ttfa_s)}")
    print(f"audio     {tally.audio_s:.1f} s in {wall:.1f} s: {tally.audio_s / wall:.2f} s of audio per second")
    for f in sorted(set(tally.failures))[:10]:
        print(f"failure   {f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "health": health,
                    "clients": args.clients,
                    "duration_s": args.duration,
                    "wall_s": wall,
                    "ok": done,
                    "failures": tally.failures,
                    "latency_s": tally.latency_s,
                    "ttfa_s": tally.ttfa_s,
                    "audio_s": tally.audio_s,
                },
                f,
                indent=1,
            )
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
