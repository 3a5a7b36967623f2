"""The HTTP API (``audio8 serve``): OpenAI-compatible speech, voices, health and metrics (FastAPI).

Endpoints:

* ``POST /v1/audio/speech`` (JSON), as OpenAI's: ``model`` (any name; echoed in the ``X-Model`` header),
  ``input`` (1 to ``max_input_chars`` characters, 4096 by default as OpenAI's), ``voice`` (a stored voice; absent,
  or one of OpenAI's names such as ``alloy`` that is not a stored voice: the model's own voice),
  ``response_format`` wav | pcm | flac | mp3 | opus (default mp3 as OpenAI's; wav and pcm are 16-bit
  little-endian at 44.1 kHz, the model's rate, not OpenAI's 24 kHz: the ``X-Sample-Rate`` header says it; opus
  is Ogg Opus at 48 kHz), ``speed`` (only 1.0: there is no time stretch, so any other value is a 400 rather
  than ignored), ``stream_format`` (only ``audio``). Our extras: ``stream`` (true: send the audio as it is made,
  chunked, every ``chunk_frames`` frames; wav, pcm, mp3 and opus), ``seed`` (the same request and seed give the
  same bytes; the seed used is in ``X-Seed``), ``temperature``, ``top_p``, ``top_k`` and ``max_frames`` (a
  frame cap per piece, at most the server's). Long input is split into pieces (``TTS.stream``).
  With the OpenAI SDK: ``client.audio.speech.create(model=..., voice=..., input=..., extra_body={"seed": 1})``.
* ``GET /v1/voices``, ``POST /v1/voices`` (multipart: ``name``, ``transcript``, ``audio`` file of at most
  ``max_upload_bytes``; ``replace=true`` overwrites), ``DELETE /v1/voices/{name}``.
* ``GET /health``: model, backend and the device in use, workers, queue. ``GET /metrics``: Prometheus text
  (requests by status, frames, audio and compute seconds, RTF, time to first audio, queue depth).

Errors are JSON ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's shape) with 400 (bad
request), 404 (no such voice), 413 (upload too large), 503 (queue full, with ``Retry-After``) or 500.

Concurrency: a model instance is not thread-safe (the KV state is its backend's), so the server holds
``workers`` instances, each used by one request at a time on its own thread; requests wait in a queue of at
most ``max_queue`` (then 503). Requests share nothing but the voice store: each builds its own prompt, noise
and codec state, and the backend's prefill clears the KV state. A streaming client that disconnects stops its
generation at the next frame and frees its worker.
With ``audio8 serve --batch N`` the workers are N rows of one model instance (:mod:`..backends.torch.rows`): the same
isolation, with their frames computed in shared batched calls.
The routes reach the model through a :class:`.synth.Synthesizer`: the workers of this process, or replicas on a Ray
cluster (``audio8 serve --ray``, :mod:`.ray_app`).
"""

from .app import create_app, serve_in_thread
from .errors import ApiError
from .schemas import SpeechRequest
from .state import ServerSettings

__all__ = ["ApiError", "ServerSettings", "SpeechRequest", "create_app", "serve_in_thread"]
