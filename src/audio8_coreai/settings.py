"""Every runtime setting in one validated tree, read by the CLI, the servers, Ray, the tools and the API:
``DEFAULTS.server.port``, ``DEFAULTS.torch.prefix_cache`` etc.

One root :class:`Settings` (pydantic-settings) holds a group per part: ``speech`` (text and streaming), ``torch``,
``server``, ``wyoming``, ``ray``, ``bench``, ``measure`` (parity, gate, make-checkpoint) and ``coreai``. Each field
has its default, its constraint and one description (shown by the CLI's ``--help`` where an option sets it).
:data:`DEFAULTS` is built once, at import, from the environment: ``AUDIO8_<GROUP>__<FIELD>`` (two underscores
between group and field, any case) sets a field, e.g. ``AUDIO8_SERVER__PORT=9000``, ``AUDIO8_TORCH__CUDA_GRAPHS=false``,
``AUDIO8_SERVER__VOICE_MAP='{"alloy": "ana"}'`` (lists and mappings as JSON), ``none`` (any case) or ``null`` for a
field that takes None.
A value the field does not take, or a name that is no field, raises ConfigError naming the variable and what it
takes (the ``audio8`` command says it in one line). A command's option overrides its field for that run
(:func:`override`, validated the same way). Only values a user or an operator might tune live here; the
publisher's format (ids, file names, codec constants) stays with the code that reads it. A frame is 2048 samples
at 44.1 kHz (46 ms).
"""

from __future__ import annotations

import json
import os
import re
import typing
from collections.abc import Mapping
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from .errors import ConfigError
from .settings_words import kind_of, takes, wrong_variable

PREFIX = "AUDIO8_"
Group = TypeVar("Group", bound=BaseModel)


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf seconds: no bound at all

    @field_validator("*", mode="before")
    @classmethod
    def _none(cls, value: object, info: ValidationInfo) -> object:
        """``none`` in any case, or ``null``, is None for a field that takes None (as a variable's ``none``)."""
        if isinstance(value, str) and value.strip().lower() in ("none", "null"):
            if kind_of(cls.model_fields[info.field_name])[1]:
                return None
        return value


class SpeechSettings(_Group):
    """Text and streaming (engine/stream.py, plan.py, tts.py)."""

    chunk_frames: int = Field(16, ge=1, description="frames per streamed chunk (2048 samples, 46 ms, a frame)")
    first_chunk_frames: int = Field(
        1, ge=1, description="frames in a stream's first chunk (TTFA waits for them); chunks then double"
    )
    pause_s: float = Field(0.25, ge=0, le=10, description="silence between the pieces of a split text (seconds)")
    split_frames_per_token: int = Field(
        8, ge=1, le=64, description="frames one text token takes when spoken, with margin: how long texts are split"
    )
    min_voice_frames: int = Field(64, ge=1, description="frames a clone prompt must leave in the context (64: 3.0 s)")
    # An utterance's frame cap when its caller sets none (engine/loop.py frame_budget): cap_base_frames plus
    # cap_frames_per_token per text token, about 3x read speech (6 frames a token), so a model that never samples
    # eos stops soon after the words' time; the checkpoint's max_new_tokens and the context cap it too.
    cap_base_frames: int = Field(64, ge=0, description="frames of every utterance's cap (64: 3.0 s)")
    cap_frames_per_token: int = Field(16, ge=1, description="frames of the cap per text token (16: 0.74 s)")

    @field_validator("first_chunk_frames")
    @classmethod
    def _first_fits(cls, first: int | None, info: ValidationInfo) -> int | None:
        return _first_chunk(first, info)


def _first_chunk(first: int | None, info: ValidationInfo) -> int | None:
    """A stream's first chunk is at most its other chunks (``chunk_frames``, validated before it)."""
    chunk = info.data.get("chunk_frames")
    if first is not None and chunk is not None and first > chunk:
        raise ValueError(f"first_chunk_frames must be 1 to chunk_frames ({chunk}), got {first}")
    return first


class TorchSettings(_Group):
    """The torch backend (backends/torch/backend.py, cudagraphs.py, rows.py; engine/noise.py)."""

    decode_chunk_frames: int = Field(16, ge=1, description="frames per codec push decoding a whole utterance")
    prefix_cache: int = Field(8, ge=1, description="prompt heads whose KV state is kept, least recently used dropped")
    cuda_graphs_kept: int = Field(4, ge=1, description="CUDA graphs kept per batch size, one per sampling set, LRU")
    codec_process: bool | None = Field(
        None, description="decode audio in a process of its own; None: on a CPU with 2+ CPUs usable"
    )
    codec_threads: int | None = Field(
        None, ge=1, description="the codec process's torch threads; None: half the CPUs (>= 1), frames the rest"
    )
    codec_queue: int = Field(2, ge=1, description="codec chunks in flight beside the frame loop; the loop waits beyond")
    huge_pages_min_bytes: int = Field(2**28, ge=0, description="a CPU load of a model file this big uses huge pages")
    cuda_graphs: bool | None = Field(
        None, description="replay frames as CUDA graphs (one launch per frame); None: on when the device is CUDA"
    )
    fused_kernels: bool | None = Field(
        None, description="norm+residual, RoPE+KV write, SwiGLU as Triton kernels; None: on when on CUDA"
    )
    batch_buckets: tuple[int, ...] = Field(
        (1, 2, 4, 8, 16, 32, 64, 128, 256), description="batched graphs' sizes: rows padded up to the next"
    )
    noise_threads: int = Field(4, ge=1, description="threads drawing each stream's next noise while a step runs")
    batch_codec: bool | None = Field(
        None, description="batched serving: the streams' codec pushes stacked in one call; None: on CUDA"
    )
    codec_dtype: Literal["fp32", "bf16", "tf32"] | None = Field(
        None, description="the codec decoder's form, not exact but fp32: bf16, tf32 (CUDA); None: the model's"
    )

    @field_validator("batch_buckets")
    @classmethod
    def _rising(cls, buckets: tuple[int, ...]) -> tuple[int, ...]:
        if not buckets or buckets[0] < 1 or any(b <= a for a, b in zip(buckets, buckets[1:])):
            raise ValueError(f"batch_buckets must be rising whole numbers >= 1, got {list(buckets)}")
        return buckets


# The rates every response format takes (MP3's and AAC's nine; audio/aac.py AAC_RATES, tests/test_settings.py).
SampleRate = Literal[8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000]


class ServerSettings(_Group):
    """The HTTP server (server/, backends/torch/rows.py; ``audio8 serve``). A request may ask for less than
    ``max_frames``, never more; a stream's chunk sizes are ``chunk_frames``/``first_chunk_frames``."""

    host: str = Field("127.0.0.1", min_length=1, description="address to listen on (0.0.0.0: every interface)")
    port: int = Field(8000, ge=1, le=65535, description="TCP port")
    workers: int = Field(1, ge=1, description="model instances, each serving one request at a time")
    batch: int = Field(0, ge=0, description="requests served at once by ONE model instance, frames batched; 0: off")
    cuda_batch: int = Field(32, ge=0, description="audio8 serve on CUDA given no --batch or --workers: its --batch")
    max_queue: int = Field(8, ge=0, description="requests that may wait for a worker; more get 503")
    max_input_chars: int = Field(4096, ge=1, description="longest input text per speech request (OpenAI's limit)")
    max_speech_body_bytes: int = Field(2**20, ge=1, description="a speech request's JSON body: the longest input")
    max_upload_bytes: int = Field(32 * 2**20, ge=1, le=2**30, description="a voice upload (30 s 96 kHz stereo: 23 MB)")
    max_frames: int | None = Field(None, ge=1, description="frame cap per utterance; None: the model's budget")
    chunk_frames: int | None = Field(None, ge=1, description="frames per streamed chunk; None: speech.chunk_frames")
    first_chunk_frames: int | None = Field(
        None, ge=1, description="frames in a stream's first chunk; None: speech.first_chunk_frames"
    )
    sample_rate: SampleRate | None = Field(
        None, description="every body's rate; None: pcm_sample_rate, the rest the model's"
    )
    voice_map: dict[str, str] = Field(default_factory=dict, description="OpenAI voice names onto stored voices")
    cors_origins: tuple[str, ...] = Field(
        (),
        description="web page origins that may call the API from a browser (CORS); * any; none: same origin only",
        examples=[["https://app.example.com", "http://localhost:3000"]],
    )

    default_voice: str | None = Field(None, description="stored voice of requests naming none; None: the model's")
    gather_s: float = Field(0.003, ge=0, le=1, description="batched: how long a frame call waits for the other rows")
    recent_s: float = Field(2.0, gt=0, description="batched: a row heard from this recently is expected again soon")
    pcm_sample_rate: int = Field(
        24000, ge=8000, le=48000, description="a pcm body's rate unless request or server sets one"
    )
    # Seeds stop at request.MAX_SEED, 2**53 - 1, as a request's (tests/test_settings.py holds them equal)
    default_voice_seed: int = Field(0, ge=0, le=2**53 - 1, description="seed of a request naming no voice nor seed")
    # Slow clients (uvicorn's own knobs, set by server/connections.py). uvicorn times out nothing before a request's
    # head is whole and none of its body, so the server adds a deadline for a whole request.
    request_timeout_s: float = Field(60.0, gt=0, description="a whole request must come within this of its start")
    keep_alive_s: int = Field(5, ge=1, description="uvicorn's timeout_keep_alive: an idle connection then closed")
    max_connections: int = Field(256, ge=1, description="uvicorn's limit_concurrency: connections at once, then 503")
    max_head_bytes: int = Field(64 * 1024, ge=1024, description="a request head: past it 431, then a lingering close")
    max_unread_body_bytes: int = Field(
        4 * 2**20, ge=0, description="a request its early answer (413, 431) left unread: read and dropped, then closed"
    )
    stream_buffer_chunks: int = Field(4, ge=1, description="chunks a stream holds for a client not reading; then waits")
    stall_s: float = Field(30.0, gt=0, description="a stream whose client reads nothing this long is dropped")
    shutdown_s: float = Field(
        5.0, gt=0, description="on SIGTERM, answers still running this long after are cut (docker stop waits 10 s)"
    )
    stale_temp_s: float = Field(3600.0, gt=0, description="voice store: temporary files this old are swept at open")

    @field_validator("first_chunk_frames")
    @classmethod
    def _first_fits(cls, first: int | None, info: ValidationInfo) -> int | None:
        return _first_chunk(first, info)

    @field_validator("sample_rate", mode="before")
    @classmethod
    def _rate_from_text(cls, rate: object) -> object:
        """A variable's text ``16000`` is the number: a Literal of ints takes no text (every rate was refused)."""
        return int(rate) if isinstance(rate, str) and rate.strip().isascii() and rate.strip().isdigit() else rate

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        """Each origin as a browser sends it: scheme://host[:port] in lower case, no path (a trailing / would never
        match), no default port (:443 for https, :80 for http: browsers leave it out), no wildcard but * alone."""
        said = []
        for origin in origins:
            if origin != "*" and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#*]+", origin):
                raise ValueError(
                    f"cors_origins holds {origin!r}: an origin is scheme://host[:port] with no path or wildcard, "
                    "e.g. https://app.example.com, or * alone for any"
                )
            origin = origin.lower()
            said.append(re.sub(r"^(https://[^:]+):443$|^(http://[^:]+):80$", lambda m: m[1] or m[2], origin))
        return tuple(said)

    @field_validator("voice_map")
    @classmethod
    def _lower_names(cls, voice_map: dict[str, str]) -> dict[str, str]:
        lowered = {name.lower(): voice for name, voice in voice_map.items()}  # a request's name is matched so
        if len(lowered) < len(voice_map):
            raise ValueError("voice_map maps a name twice (names differing only in case are one)")
        return lowered


class WyomingSettings(_Group):
    """The Wyoming server for Home Assistant (server/wyoming.py; ``audio8 wyoming``). A client reading nothing is
    dropped after the HTTP server's ``server.stall_s``."""

    host: str = Field("127.0.0.1", min_length=1, description="address to listen on (0.0.0.0: every interface)")
    port: int = Field(10200, ge=1, le=65535, description="TCP port: Wyoming's for text to speech (Home Assistant's)")
    voice: str = Field("audio8", min_length=1, description="the name the model's own voice is listed under")
    seed: int | None = Field(
        None, ge=0, le=2**53 - 1, description="seed of every utterance; None: the own voice's default, else drawn"
    )
    # Sampling (None: the checkpoint's), within the publisher's rules (config.py GenerationConfig.check)
    temperature: float | None = Field(None, gt=0, description="sampling temperature")
    top_k: int | None = Field(None, ge=1, description="top-k")
    top_p: float | None = Field(None, gt=0, le=1, description="top-p")
    max_frames: int | None = Field(None, ge=1, description="frame cap per utterance; None: the model's budget")
    max_input_chars: int = Field(4096, ge=1, description="longest text per request or unfinished sentence")
    max_event_bytes: int = Field(65536, ge=1024, description="one event's line, data and payload each")
    idle_s: float = Field(60.0, gt=0, description="a client silent this long (between events or within one) closed")
    buffer_s: float = Field(60.0, ge=1, le=3600, description="audio held for a client reading slower; then it waits")
    max_connections: int = Field(32, ge=1, description="clients connected at once; more are refused (error: busy)")
    shutdown_s: float = Field(5.0, gt=0, description="on a stop, answers still running this long after are cut")


class RaySettings(_Group):
    """Ray Serve (server/ray_app.py; ``audio8 serve --ray``, deploy/serve_config.yaml). Each Synth replica runs
    ``server.batch`` rows (0: one utterance at a time) behind the HTTP limits of ``server``."""

    model: str | None = Field(None, description="a checkpoint every replica can read; None: the publisher's")
    voices: str | None = Field(None, description="the voice store every replica shares; None: each machine's")
    device: str = Field("auto", description="each replica's device: auto, cpu, cuda")
    precision: str | None = Field(None, description="torch precision; None: the device's default")
    replicas: int = Field(1, ge=1, description="Synth replicas (one engine each) when not autoscaled")
    autoscale: tuple[int, int] | None = Field(None, description="[min, max] replicas, scaled on requests in flight")
    gpus: float = Field(0.0, ge=0, description="GPUs per Synth replica")
    cpus: float = Field(1.0, ge=0, description="CPUs per Synth replica (also its torch threads)")
    ingress_requests: int = Field(256, ge=1, description="requests one ingress replica holds at once")
    retry_after_s: float = Field(1.0, gt=0, description="the Retry-After of the 503 a full cluster answers")

    @field_validator("autoscale")
    @classmethod
    def _scale_range(cls, scale: tuple[int, int] | None) -> tuple[int, int] | None:
        if scale is not None and not 0 <= scale[0] <= scale[1] >= 1:
            raise ValueError(f"autoscale must be min and max replicas, 0 <= min <= max, max >= 1; got {list(scale)}")
        return scale


class BenchSettings(_Group):
    """``audio8 bench`` (measure/bench/): one configuration, each run in a subprocess of its own."""

    checkpoint: str = Field("~/.cache/audio8-coreai/bench-0.6b", description="the random 0.6b checkpoint's folder")
    frames: int = Field(32, ge=1, description="frames per timed frame loop (fewer when the model draws eos)")
    runs: int = Field(3, ge=1, description="timed runs after one warm-up (medians reported)")
    backend: Literal["torch"] = Field("torch", description="the backend measured (the bench drives torch's)")
    device: str = Field("cpu", description="the device measured: cpu, cuda, cuda:N")
    precision: str = Field("fp32", description="torch precision measured")
    threads: int | None = Field(None, ge=1, description="torch threads; None: torch's")
    baseline: bool = Field(False, description="measure the publisher-style frame instead of the backend's")
    codec_dtype: Literal["fp32", "bf16", "float32", "bfloat16", "tf32"] | None = Field(
        None, description="codec dtype (tf32: CUDA); None: the backend's (fp32 on CPU)"
    )
    cuda_graphs: bool = Field(False, description="the frame replayed as one CUDA graph")


class MeasureSettings(_Group):
    """The measuring tools (``audio8 parity | gate | make-checkpoint``)."""

    tolerance: float = Field(1e-4, gt=0, description="max |logit/waveform diff| for fp32 parity")
    asr_margin: float = Field(0.05, ge=0, le=1, description="error-rate points the port may lose per language")
    speaker_margin: float = Field(0.05, ge=0, le=2, description="mean speaker cosine the port may lose")
    checkpoint_seed: int = Field(0, ge=0, description="the seed of make-checkpoint's random weights")


class CoreAISettings(_Group):
    """Core AI assets (backends/coreai/; ``audio8 convert``)."""

    decoder_frames: int = Field(16, ge=1, description="codec decoder push: frames per call (state carried)")
    decoder_first_frames: int = Field(
        0, ge=0, description="frames of the codec decoder's `first` function, below decoder_frames (0: none)"
    )
    encoder_frames: int = Field(
        216, ge=1, description="codec encoder bucket, the longest voice-registration clip (216: 10 s)"
    )


class Settings(BaseSettings):
    """The whole tree; each group's fields from ``AUDIO8_<GROUP>__<FIELD>`` where set (module docstring)."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_nested_delimiter="__", env_parse_none_str="none", frozen=True, extra="forbid"
    )

    speech: SpeechSettings = Field(default_factory=SpeechSettings)
    torch: TorchSettings = Field(default_factory=TorchSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    wyoming: WyomingSettings = Field(default_factory=WyomingSettings)
    ray: RaySettings = Field(default_factory=RaySettings)
    bench: BenchSettings = Field(default_factory=BenchSettings)
    measure: MeasureSettings = Field(default_factory=MeasureSettings)
    coreai: CoreAISettings = Field(default_factory=CoreAISettings)


def override(group: Group, names: Mapping[str, str] | None = None, **changes: object) -> Group:
    """``group`` with a command's options ``changes`` (field: value), validated as the tree is; raises ConfigError
    '--field must be ..., got ...' (``names``: an option spelt otherwise than ``--field``, e.g. ``--replica-gpus``)."""
    try:
        return type(group)(**{**dict(group), **changes})
    except ValidationError as e:
        error, fields = e.errors()[0], type(group).model_fields

        def option(field: str) -> str:
            return (names or {}).get(field, "--" + field.replace("_", "-"))

        name = str(error["loc"][0]) if error["loc"] else ""
        if name in fields and error["type"] != "value_error":
            said = f"{option(name)} must be {takes(fields[name], False)}, got {error['input']!r}"
            raise ConfigError(said, name) from None
        said = str(error["msg"]).removeprefix("Value error, ")  # a rule over fields: said with the options' names
        named = {field for field in fields if "_" in field or field == name}  # not a plain word such as "replicas"
        said = re.sub(r"\b[a-z_]+\b", lambda m: option(m[0]) if m[0] in named else m[0], said)
        raise ConfigError(said, name) from None


def from_environment() -> Settings:
    """The tree with the ``AUDIO8_*`` variables set now; raises ConfigError naming a variable that is wrong, or one
    that names no group (the tree would ignore it)."""
    groups = list(Settings.model_fields)
    for name, value in os.environ.items():
        if not name.upper().startswith(PREFIX):
            continue
        group, nested, field = name[len(PREFIX) :].lower().partition("__")
        if group not in groups or (nested and not field):
            raise ConfigError(
                f"{name} is not a setting: a variable is AUDIO8_<GROUP>__<FIELD> with GROUP one of "
                f"{', '.join(g.upper() for g in groups)} (unset it, or fix its name)",
                name,
            )
        fields = Settings.model_fields[group].annotation.model_fields  # type: ignore[union-attr]
        if nested and field.partition("__")[0] not in fields:  # named as set (pydantic named the group); a key of a
            # mapping field is a variable of its own (AUDIO8_SERVER__VOICE_MAP__ALLOY)
            raise ConfigError(f"{name} is not a setting: the {group} group has {', '.join(fields)}", name)
        if not nested and value.strip().lower() in ("null", "none"):  # read as JSON null: the group unset
            raise ConfigError(wrong_variable(name.upper(), None, {"type": "model_type"}), name)
    try:
        return Settings()
    except ValidationError as e:
        error = e.errors()[0]
        group, field = (list(error["loc"]) + ["", ""])[:2]
        variable = _variable(str(group), str(field))
        if error["type"] == "extra_forbidden":
            fields = ", ".join(Settings.model_fields[str(group)].annotation.model_fields)  # type: ignore[union-attr]
            raise ConfigError(f"{variable} is not a setting: the {group} group has {fields}", str(field)) from None
        info = Settings.model_fields[str(group)].annotation.model_fields.get(str(field))  # type: ignore[union-attr]
        raise ConfigError(wrong_variable(variable, info, error), str(field)) from None
    except SettingsError as e:  # a list or mapping that is not JSON
        raise ConfigError(_unparsed() or f'{e}: give it as JSON, e.g. [1, 2, 4] or {{"alloy": "ana"}}') from None


def _variable(group: str, field: str) -> str:
    """The variable that set ``group.field``: ``AUDIO8_GROUP__FIELD``, or the group's own JSON variable."""
    nested, whole = f"{PREFIX}{group}__{field}".upper(), f"{PREFIX}{group}".upper()
    names = {key.upper() for key in os.environ}
    if not field:  # the group as a whole: no JSON object
        return whole
    return f"{whole}'s {field}" if whole in names and nested not in names else nested


def _unparsed() -> str | None:
    """What is wrong with the ``AUDIO8_*`` variable read as JSON (a group's, a list's, a mapping's) whose value is not
    JSON, with the JSON its field takes; None when none is."""
    for key, value in os.environ.items():
        group, _, field = key.upper().removeprefix(PREFIX).lower().partition("__")
        model = getattr(Settings.model_fields.get(group), "annotation", None)
        if not key.upper().startswith(PREFIX) or model is None:
            continue
        info = model.model_fields.get(field) if field else None
        if field and (info is None or typing.get_origin(kind_of(info)[0]) not in (tuple, dict)):
            continue
        try:
            json.loads(value)
        except ValueError:
            example = takes(info) if info is not None else 'JSON, e.g. {"port": 8000} for a group'
            return f"{key} is not JSON: give it as {example}"
    return None


DEFAULTS = from_environment()
