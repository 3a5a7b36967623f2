"""Every runtime default in one place, read by the CLI, the server and the API: ``DEFAULTS.chunk_frames`` etc.

Only values a user or an operator might tune live here; the publisher's format (ids, file names, codec
constants) stays with the code that reads it. A frame is 2048 samples at 44.1 kHz (46 ms).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """The defaults of every tunable value; one line each says what it is."""

    # Text and streaming (engine/stream.py, tts.py)
    chunk_frames: int = 16  # frames per streamed chunk: 16 x 2048 samples = 0.74 s of audio
    first_chunk_frames: int = 1  # frames in a stream's first chunk (TTFA waits for them); chunks then double
    pause_s: float = 0.25  # silence between the pieces of a split text: a sentence break's pause in read speech
    frames_per_token: int = 8  # frames one text token takes when spoken, with margin: how text is split
    min_voice_frames: int = 64  # frames a voice's clone prompt must leave in the context (64 x 2048 samples = 3.0 s)
    # An utterance's frame cap when its caller sets none (engine/loop.py frame_budget): cap_base_frames plus
    # cap_frames_per_token per text token, about 3x read speech (6 frames a token), so a model that never samples
    # eos stops soon after the words' time; the checkpoint's max_new_tokens and the context cap it too.
    cap_base_frames: int = 64  # 64 frames = 3.0 s
    cap_frames_per_token: int = 16  # 16 frames = 0.74 s per text token

    # Torch backend (backends/torch/backend.py, cudagraphs.py)
    decode_chunk_frames: int = 16  # frames per codec push when decoding a whole utterance (fastest, smallest)
    prefix_cache: int = 8  # prompt heads whose KV state is kept, least recently used dropped first
    cuda_graphs_kept: int = 4  # captured CUDA graphs kept per batch size, one per set of sampling settings, LRU
    codec_process: bool | None = None  # the codec decoder in a process of its own; None: on a CPU with 2+ CPUs usable
    codec_threads: int | None = None  # the codec process's torch threads; None: half the CPUs (>= 1), frames the rest
    codec_queue: int = 2  # codec chunks in flight beside the frame loop (decoding or waiting); the loop waits beyond
    huge_pages_min_bytes: int = 2**28  # a CPU load of a model file at least this big backs its weights by huge pages
    cuda_graphs: bool | None = None  # frames replayed as CUDA graphs (one launch per frame); None: on when on CUDA
    fused_kernels: bool | None = None  # norm+residual, RoPE+KV write, SwiGLU as Triton kernels; None: on when on CUDA
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # batched graphs: rows padded up to the next
    noise_threads: int = 4  # threads drawing each stream's next noise while a step runs (frames on a GPU)
    batch_codec: bool | None = None  # batched serving: the streams' codec pushes stacked in one call; None: on CUDA

    # Server (server/, backends/torch/rows.py; `audio8 serve`)
    host: str = "127.0.0.1"  # address to listen on (0.0.0.0: every interface)
    port: int = 8000  # TCP port
    workers: int = 1  # model instances, each serving one request at a time
    max_queue: int = 8  # requests that may wait for a worker; more get 503
    max_input_chars: int = 4096  # longest input text per speech request (OpenAI's limit)
    max_speech_body_bytes: int = 1024 * 1024  # a speech request's JSON body: the longest input escaped, with room
    max_upload_bytes: int = 32 * 1024 * 1024  # a voice upload: 30 s of 96 kHz stereo float wav is 23 MB
    gather_s: float = 0.003  # batched serving: how long a ready frame call waits for the other rows' calls
    recent_s: float = 2.0  # batched serving: a row heard from this recently is expected to call again soon
    pcm_sample_rate: int = 24000  # a pcm body's rate when neither request nor server gives one (OpenAI's pcm)
    default_voice_seed: int = 0  # the seed of a request naming neither voice nor seed: the model's own voice, steady
    # Slow clients (uvicorn's own knobs, set by server/connections.py). uvicorn times out nothing before a request's
    # head is whole and none of its body, so the server adds a deadline for a whole request.
    request_timeout_s: float = 60.0  # a connection must send a whole request within this of opening or its last answer
    keep_alive_s: int = 5  # uvicorn's timeout_keep_alive: an idle connection is closed this long after an answer
    max_connections: int = 256  # uvicorn's limit_concurrency: connections at once; a request on one more gets 503
    max_head_bytes: int = 64 * 1024  # a request head (request line, headers): past it 431, the connection closed
    stream_buffer_chunks: int = 4  # chunks a stream holds for a client that is not reading; then its frames wait
    stall_s: float = 30.0  # a stream whose client reads nothing this long is dropped (its worker freed, logged)
    stale_temp_s: float = 3600.0  # voice store: temporary files older than this are a crashed write's, swept at open

    # Ray Serve (server/ray_app.py; `audio8 serve --ray`, deploy/serve_config.yaml)
    ray_replicas: int = 1  # Synth replicas (one engine each) when not autoscaled
    ray_ingress_requests: int = 256  # requests one ingress replica holds at once (a stream mostly waits on Synth)
    ray_retry_after_s: float = 1.0  # the Retry-After of the 503 a full cluster answers (seconds)

    # Measurement and conversion tools (`audio8 parity | gate | bench | convert | make-checkpoint`)
    tolerance: float = 1e-4  # max |logit/waveform diff| for fp32 parity with the oracle
    asr_margin: float = 0.05  # gate: error-rate points (absolute) the port may lose to the reference per language
    speaker_margin: float = 0.05  # gate: mean speaker cosine the port may lose to the reference
    bench_checkpoint: str = "~/.cache/audio8-coreai/bench-0.6b"  # bench: the random 0.6b checkpoint's folder
    bench_frames: int = 32  # bench: frames per timed frame loop (fewer when the model draws eos)
    bench_runs: int = 3  # bench: timed runs after one warm-up (medians reported)
    decoder_frames: int = 16  # Core AI codec decoder push: frames per call (its state carries the utterance)
    decoder_first_frames: int = 0  # Core AI codec decoder's opt-in 1-frame function `first` (0: none; docs/coreai.md)
    encoder_frames: int = 216  # Core AI codec encoder bucket: 10.0 s, the voice-registration clip
    checkpoint_seed: int = 0  # make-checkpoint: the seed of the random weights (same seed, same files)

    # Wyoming server for Home Assistant (server/wyoming.py; `audio8 wyoming`)
    wyoming_port: int = 10200  # TCP port: the Wyoming convention for text to speech (Home Assistant's default)
    wyoming_voice: str = "audio8"  # the name the model's own voice is listed under (describe, synthesize)
    wyoming_max_event_bytes: int = 65536  # one event's line, data and payload each: a synthesize of the longest text
    wyoming_idle_s: float = 60.0  # a client silent this long (between events or within one) is closed


DEFAULTS = Settings()
