"""The byte-bound inputs of issue 28 against running servers, with the server's RSS before and after each.

    python benchmarks/hostile_probe.py --http-port 8918 --http-pid PID [--wyoming-port 10299 --wyoming-pid PID]

HTTP (``audio8 serve``): 8 connections at once each sending a 32 MB header; a chunked ``POST /v1/voices`` of 256 MB
(no content-length). Wyoming (``audio8 wyoming``): an ``audio-chunk`` promising 10^11 bytes followed by 400 MB; a
``synthesize`` promising 10^12 bytes of data and sending none. Printed per input: what the client got (the first
answer line, or the error its sends met) and the server process's RSS (psutil) before -> after.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time

import psutil

MB = 2**20


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / MB


def _pour(sock: socket.socket, chunk: bytes, total: int) -> int:
    """Send ``chunk`` until ``total`` bytes went or the peer stopped taking them; the bytes sent."""
    sent = 0
    try:
        while sent < total:
            sock.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    return sent


def _answer(sock: socket.socket) -> str:
    """The first line the server sent, or the error reading it met."""
    sock.settimeout(10)
    try:
        return sock.recv(4096).split(b"\n")[0].decode(errors="replace")[:120]
    except OSError as e:
        return type(e).__name__


def huge_heads(port: int) -> str:
    def one(results: list) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
            sent = _pour(s, b"a" * 65536, 32 * MB)
            results.append(f"{sent / MB:.1f} MB sent, {_answer(s)}")

    results: list[str] = []
    threads = [threading.Thread(target=one, args=(results,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return "; ".join(sorted(results))


def chunked_upload(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(
            b"POST /v1/voices HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        part = b'--b\r\nContent-Disposition: form-data; name="audio"; filename="a.wav"\r\n\r\n'
        s.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        sent = _pour(s, b"10000\r\n" + b"\0" * 65536 + b"\r\n", 256 * MB)
        return f"{sent / MB:.2f} MB sent, {_answer(s)}"


def wyoming_payload(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(json.dumps({"type": "audio-chunk", "payload_length": 10**11}).encode() + b"\n")
        sent = _pour(s, b"\0" * 65536, 400 * MB)
        return f"{sent / MB:.1f} MB sent, {_answer(s)}"


def wyoming_data(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(json.dumps({"type": "synthesize", "data_length": 10**12}).encode() + b"\n")
        t0 = time.monotonic()
        answer = _answer(s)
        return f"after {time.monotonic() - t0:.1f} s: {answer}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--http-pid", type=int, required=True)
    ap.add_argument("--wyoming-port", type=int)
    ap.add_argument("--wyoming-pid", type=int)
    args = ap.parse_args()
    probes = [
        ("HTTP: 8 x a 32 MB header", huge_heads, args.http_port, args.http_pid),
        ("HTTP: a chunked 256 MB voice upload", chunked_upload, args.http_port, args.http_pid),
    ]
    if args.wyoming_port and args.wyoming_pid:
        probes += [
            (
                "Wyoming: audio-chunk promising 10^11 bytes, 400 MB sent",
                wyoming_payload,
                args.wyoming_port,
                args.wyoming_pid,
            ),
            ("Wyoming: synthesize promising 10^12 bytes of data", wyoming_data, args.wyoming_port, args.wyoming_pid),
        ]
    for name, probe, port, pid in probes:
        before = rss_mb(pid)
        got = probe(port)
        print(f"{name}: RSS {before:.1f} -> {rss_mb(pid):.1f} MB; {got}", flush=True)


if __name__ == "__main__":
    main()
