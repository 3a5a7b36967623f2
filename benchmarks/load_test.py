"""Load test for `audio8 serve`: N concurrent clients for a bounded time; latency percentiles, TTFA, failures.

    python benchmarks/load_test.py --url http://127.0.0.1:8000 [--clients 4] [--duration 30] ...
    python benchmarks/load_test.py --model CHECKPOINT [--workers 2 | --batch 4] [--precision P] ...   # own server

Each client sends ``POST /v1/audio/speech`` again and again (streamed by default) until ``--duration`` seconds
have passed, then finishes its request in flight. Per request: **TTFA** (time to the first audio bytes),
**latency** (time to the last byte) and the audio seconds received. Printed: requests, failures (any status but
200, a transport error or an empty body; a 503 from a full queue counts too), p50/p90/p99/max of latency and
TTFA, audio seconds per wall second. Exits 1 when any request failed.

The hostile mix (issue 17's campaign): ``--mix`` draws each request's format (wav, pcm, mp3, opus, aac; flac
whole only) and whether it streams; ``--disconnect P`` drops that share of requests early (a stream after its
first bytes, a whole one by a 0.2 s read timeout); ``--seeds K`` reuses K seeds so the same request comes again
and its bytes must be the same (else **cross-talk**: opus is left out, its Ogg serial is random); a 503 with an
OpenAI-shaped JSON error is counted as **refused** (a full queue), not failed; a request past ``--timeout`` is a
**hang**. ``--backoff`` waits a 503's Retry-After before the next request (else a refused client asks again at
once). ``--server-pid`` samples that process's RSS, threads and open descriptors at the start and after the run
(``/health`` must then show no request running or queued).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import httpx
import numpy as np

from audio8_coreai.measure.args import count, count_or_zero, seconds

TEXTS = [
    "The meeting has been moved to Thursday afternoon.",
    "Please remember to bring the signed forms with you.",
    "The train to the airport leaves every twenty minutes.",
    "今天的天气很好，我们去公园散步吧。",
]


FORMATS = ("wav", "pcm", "mp3", "opus", "aac", "flac")  # flac: whole only (its header gives the length)


@dataclass
class Tally:
    latency_s: list[float] = field(default_factory=list)
    ttfa_s: list[float] = field(default_factory=list)
    audio_s: float = 0.0
    failures: list[str] = field(default_factory=list)
    refused: int = 0  # clean 503s: a full queue
    dropped: int = 0  # requests this client left on purpose (--disconnect)
    hangs: int = 0
    crosstalk: int = 0
    digests: dict = field(default_factory=dict)  # request key -> sha256 of its body
    lock: threading.Lock = field(default_factory=threading.Lock)
    refused_for_good: threading.Event = field(default_factory=threading.Event)  # a 4xx: every client stops

    def refusal(self, r: httpx.Response) -> RuntimeError:
        """The failure of a request answered ``r`` (not 200): a client's error (4xx but 408 and 429) would be
        the same for every request of this load, so the run stops (it sent thousands a second)."""
        if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
            self.refused_for_good.set()
        return RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")


def _clean_503(r: httpx.Response) -> bool:
    try:
        error = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and bool(error.get("message")) and bool(error.get("code"))


def mixed_request(client: httpx.Client, url: str, body: dict, leave: bool, backoff: bool, tally: Tally) -> None:
    """One request of the hostile mix: refused, dropped on purpose, or whole; its body's digest checked against
    the same request's earlier bodies."""
    key = (body["input"], body["seed"], body["response_format"], body["stream"])
    timeout = httpx.Timeout(client.timeout.read, read=0.2) if leave and not body["stream"] else client.timeout
    digest, t0, first = hashlib.sha256(), time.perf_counter(), None
    try:
        with client.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                r.read()
                if r.status_code == 503 and _clean_503(r):
                    with tally.lock:
                        tally.refused += 1
                    if backoff:  # as a polite client: wait what the server asks, at most 2 s
                        time.sleep(min(float(r.headers.get("retry-after", 1)), 2.0))
                    return
                raise tally.refusal(r)
            for data in r.iter_bytes():
                first = time.perf_counter() - t0 if first is None else first
                digest.update(data)
                if leave:  # a stream's client leaves after its first bytes
                    with tally.lock:
                        tally.dropped += 1
                    return
    except httpx.ReadTimeout:
        with tally.lock:
            if leave:
                tally.dropped += 1
            else:
                tally.hangs += 1
                tally.failures.append(f"hang: no answer within {client.timeout.read:g} s ({key[1:]})")
        return
    except Exception as e:
        with tally.lock:
            tally.failures.append(f"{type(e).__name__}: {e}")
        return
    with tally.lock:
        tally.latency_s.append(time.perf_counter() - t0)
        tally.ttfa_s.append(first or 0.0)
        if body["response_format"] != "opus":
            seen = tally.digests.setdefault(key, digest.hexdigest())
            tally.crosstalk += seen != digest.hexdigest()


def one_request(client: httpx.Client, url: str, body: dict, tally: Tally) -> None:
    t0 = time.perf_counter()
    first = None
    size = 0
    try:
        with client.stream("POST", f"{url}/v1/audio/speech", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise tally.refusal(r)
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


def client_loop(
    index: int, url: str, args: argparse.Namespace, deadline: float, tally: Tally, stop: threading.Event
) -> None:
    """One client sending requests until ``deadline`` (monotonic seconds) or ``stop`` (Ctrl-C)."""
    with httpx.Client(timeout=args.timeout) as client:
        n = 0
        rng = random.Random(index)

        def going() -> bool:
            return time.monotonic() < deadline and not stop.is_set() and not tally.refused_for_good.is_set()

        while args.mix and going():
            fmt = rng.choice(FORMATS)
            body = {
                "model": "tts-1",
                "input": TEXTS[rng.randrange(len(TEXTS))],
                "response_format": fmt,
                "stream": fmt != "flac" and rng.random() < 0.5,
                "seed": rng.randrange(args.seeds),
                "max_frames": args.max_frames,
            }
            mixed_request(client, url, body, rng.random() < args.disconnect, args.backoff, tally)
        while not args.mix and going():
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


def process_stats(pid: int | None) -> dict:
    """RSS (MB), threads and open descriptors of process ``pid`` (psutil); {} without one."""
    if pid is None:
        return {}
    import psutil

    p = psutil.Process(pid)
    return {"rss_mb": round(p.memory_info().rss / 2**20, 1), "threads": p.num_threads(), "fds": p.num_fds()}


def settle(url: str, wait_s: float = 30.0) -> dict:
    """The server's /health once nothing runs or waits (at most ``wait_s`` seconds after the run)."""
    deadline = time.monotonic() + wait_s
    while True:
        health = httpx.get(f"{url}/health", timeout=30).json()
        if (health["running"] == 0 and health["queued"] == 0) or time.monotonic() > deadline:
            return {"running": health["running"], "queued": health["queued"]}
        time.sleep(0.5)


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    p = np.percentile(values, [50, 90, 99])
    return f"p50 {p[0]:.3f}  p90 {p[1]:.3f}  p99 {p[2]:.3f}  max {max(values):.3f} s"


def make_app(args: argparse.Namespace):
    """The app of ``audio8 serve`` for ``--model`` with ``--workers``/``--batch``."""
    from audio8_coreai import TTS
    from audio8_coreai.server import create_app
    from audio8_coreai.settings import ServerSettings

    instances = 1 if args.batch else args.workers
    instances = [TTS.load(args.model, device=args.device, precision=args.precision) for _ in range(instances)]
    if args.batch:
        _, instances = instances[0].batched(args.batch)
    settings = ServerSettings(workers=len(instances), max_queue=max(args.clients, 1), chunk_frames=args.chunk_frames)
    return create_app(instances, settings)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="A running server, e.g. http://127.0.0.1:8000.")
    where.add_argument("--model", help="Start a server on this checkpoint in this process.")
    ap.add_argument("--clients", type=count, default=4)
    ap.add_argument("--duration", type=seconds, default=30.0, help="Seconds of sending new requests.")
    ap.add_argument("--max-frames", type=count, default=64, help="Frame cap per request (46 ms each).")
    ap.add_argument("--no-stream", action="store_true", help="Whole responses instead of streamed ones.")
    ap.add_argument("--timeout", type=seconds, default=600.0, help="Per-request timeout, seconds.")
    ap.add_argument("--workers", type=count, default=1, help="With --model: model instances.")
    ap.add_argument(
        "--batch",
        type=count_or_zero,
        default=0,
        help="With --model: N rows of one model instance, frames batched (audio8 serve --batch).",
    )
    ap.add_argument("--precision", default=None, help="With --model: torch precision (default: the CPU default).")
    ap.add_argument("--chunk-frames", type=count, default=16, help="With --model: frames per streamed chunk.")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", help="Also write the figures here.")
    ap.add_argument("--mix", action="store_true", help="Mixed formats, streamed and whole (see above).")
    ap.add_argument("--disconnect", type=float, default=0.0, help="With --mix: share of requests left early.")
    ap.add_argument("--seeds", type=count, default=8, help="With --mix: seeds drawn from (repeats check bytes).")
    ap.add_argument("--backoff", action="store_true", help="With --mix: wait a 503's Retry-After (at most 2 s).")
    ap.add_argument("--server-pid", type=int, help="Sample this server process's RSS, threads and descriptors.")
    args = ap.parse_args()

    with contextlib.ExitStack() as stack:
        url = args.url
        if args.model:
            from audio8_coreai.server import serve_in_thread

            url = stack.enter_context(serve_in_thread(make_app(args)))
        try:
            health = httpx.get(f"{url}/health", timeout=30).json()
        except httpx.HTTPError as e:
            print(f"error: no audio8 server answers at {url} ({e}): start one (audio8 serve) or give --model")
            return 2
        before = process_stats(args.server_pid)
        tally, stop = Tally(), threading.Event()
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.clients) as pool:
            deadline = t0 + args.duration
            clients = [pool.submit(client_loop, i, url, args, deadline, tally, stop) for i in range(args.clients)]
            try:
                wait(clients)
            except KeyboardInterrupt:  # no new requests; those under way end, and what was measured is said
                stop.set()
                print("interrupted: the requests under way end first (Ctrl-C again leaves at once)", file=sys.stderr)
                try:
                    wait(clients)
                except KeyboardInterrupt:
                    os._exit(130)
        wall = time.monotonic() - t0
        settled = settle(url)
        after = process_stats(args.server_pid)

    done = len(tally.latency_s)
    print(f"server: {health['backend']} on {health['device']}, {health['workers']} worker(s)")
    print(
        f"{args.clients} clients for {args.duration:g} s ({wall:.1f} s with the last requests), "
        f"{'mixed formats' if args.mix else 'whole pcm' if args.no_stream else 'streamed pcm'}, "
        f"max {args.max_frames} frames"
    )
    print(f"requests  {done} ok, {len(tally.failures)} failed")
    if tally.refused_for_good.is_set():
        print("stopped at the server's refusal of a request (a 4xx: every request of this load would get it)")
    print(f"latency   {percentiles(tally.latency_s)}")
    print(f"TTFA      {percentiles(tally.ttfa_s)}")
    if not args.mix:  # mixed formats: the bytes do not tell the seconds
        print(f"audio     {tally.audio_s:.1f} s in {wall:.1f} s: {tally.audio_s / wall:.2f} s of audio per second")
    if args.mix:
        print(
            f"mix       {tally.refused} refused (clean 503), {tally.dropped} left early, {tally.hangs} hangs, "
            f"{tally.crosstalk} cross-talk ({len(tally.digests)} distinct requests); afterwards {settled}"
        )
    if before:
        print(f"server    {before} at the start; {after} after")
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
                    "refused": tally.refused,
                    "dropped": tally.dropped,
                    "hangs": tally.hangs,
                    "crosstalk": tally.crosstalk,
                    "settled": settled,
                    "server_before": before,
                    "server_after": after,
                },
                f,
                indent=1,
            )
    return 1 if tally.failures or tally.crosstalk or settled.get("running") or settled.get("queued") else 0


if __name__ == "__main__":
    sys.exit(main())
