"""The HTTP API (``audio8 serve``): OpenAI-compatible speech, voices, health and metrics (FastAPI).

Endpoints:

* ``POST /v1/audio/speech`` (JSON), as OpenAI's: ``model`` (any name; echoed in the ``X-Model`` header),
  ``input`` (1 to ``max_input_chars`` characters, ``DEFAULTS.server.max_input_chars``: OpenAI's), ``voice`` (a name or
  ``{"id": NAME}``: a stored voice, an OpenAI name mapped by ``serve --voice-map``, or absent, ``default`` or
  another OpenAI name such as ``alloy``: the default voice, see :mod:`.voicenames`), ``response_format``
  wav | pcm | flac | mp3 | opus | aac (default mp3 as OpenAI's; wav and pcm 16-bit little-endian; pcm at 24 kHz
  as OpenAI's, the others at the model's 44.1 kHz, opus always 48 kHz; the ``X-Sample-Rate`` header says the
  body's rate), ``speed`` (0.25-4.0: a Rubber Band time stretch, pitch kept), ``stream_format`` (``audio``, or
  ``sse``: OpenAI's ``speech.audio.delta`` events with base64 audio, then ``speech.audio.done`` with ``usage``),
  ``instructions`` (accepted and ignored: the model takes no style prompt; the response has the header
  ``X-Audio8-Instructions: ignored``). Our extras: ``sample_rate`` (8000-48000 Hz, resampled by soxr; mp3 and aac
  take the MPEG rates only; default the server's ``--sample-rate``), ``stream`` (absent, as OpenAI's: the audio is
  sent as it is made, chunked, every ``chunk_frames`` frames, in wav, pcm, mp3, opus and aac, flac whole; false: the
  whole file with its lengths; true: streamed, refused for flac), ``seed`` (the same request and seed
  give the same bytes; the seed used is in ``X-Seed``), ``temperature``, ``top_p``, ``top_k`` and ``max_frames``
  (a frame cap per piece, at most the server's). Long input is split into pieces (``TTS.stream``).
  With the OpenAI SDK: ``client.audio.speech.create(model=..., voice=..., input=..., extra_body={"seed": 1})``.
* ``GET /v1/audio/voices`` (``{"voices": [{"id", "name"}]}``), ``GET /v1/audio/models`` (``{"models": [{"id"}]}``):
  Open WebUI's lists; ``GET /v1/models`` (and ``/v1/models/{model}``): OpenAI's model list.
* ``GET /v1/voices``, ``POST /v1/voices`` (multipart: ``name``, ``transcript``, ``audio`` file of at most
  ``max_upload_bytes``; ``replace=true`` overwrites), ``DELETE /v1/voices/{name}``.
* ``GET /health``: model, backend and the device in use, workers, queue. ``GET /metrics``: Prometheus text
  (prometheus-client: requests by status, errors by code, frames, audio and compute seconds, RTF, time to first
  audio, queue depth).
* ``GET /``: a web page on these endpoints (type text, pick or upload a voice, hear it as it streams, download
  it): plain HTML/JS shipped in ``server/static`` (:mod:`.routers.page`).

Errors found before an answer's first byte are JSON ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's
shape; a failure after it cuts the stream, counted as 500 ``stream_cut``) with 400 (bad
request), 404 (no such voice), 409 (voice name taken), 413 (upload too large), 422 (no audio), 503 (queue full,
with ``Retry-After``), 507 (the server's disk full) or 500; none carries a server path or a traceback.
Every answer has an ``x-request-id`` (the client's own when sane, else a fresh one), also in the server's log lines
for that request (:mod:`.requestid`).
Slow clients are bounded: a deadline for a whole request and uvicorn's limits (:mod:`.connections`), at most
``stream_buffer_chunks`` unread chunks per stream (:mod:`.relay`).

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

__all__ = ["ApiError", "SpeechRequest", "create_app", "serve_in_thread"]
