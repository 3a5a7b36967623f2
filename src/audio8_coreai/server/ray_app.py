"""The server on Ray Serve (``audio8 serve --ray``, ``serve deploy deploy/serve_config.yaml``): many engines on many
GPUs and machines behind the same HTTP API.

Two deployments, built from the settings tree's ``ray`` and ``server`` groups (:mod:`..settings`): :class:`Synth`
wraps one engine (the ``--batch N`` batched model on its device, one GPU where there is one) and makes speech as
:class:`.synth.LocalSynthesizer` does in ``audio8 serve``, streaming the encoded chunks; :class:`Ingress` serves the
same FastAPI app (:func:`.app.create_app`: routes, validation, errors, formats, voices) over
:class:`RaySynthesizer`, which forwards speech and voice registration to Synth replicas. Ray routes, queues,
autoscales (on requests in flight) and places the replicas.

* Voice affinity: a stored voice's requests carry ``NAME@DIGEST`` (:func:`voice_key`, the digest of its codes,
  transcript and checkpoint) as Ray's multiplexed model id, so they go to the replicas that hold that voice and its
  prompt head's KV state (the backend keeps heads by their content). A replaced voice has a new key: no replica
  reuses the old one.
* The voice store is one folder all replicas share (``--voices``: a network folder on a cluster); a write is atomic
  (:meth:`.voices.VoiceStore.save`), a voice added through any replica is read by every other.
* Back-pressure: each Synth replica runs at most :func:`rows` requests (``max_ongoing_requests``); at most
  ``server.max_queue`` more wait per ingress replica (``max_queued_requests``); beyond that the answer is 503 with
  Retry-After (``ray.retry_after_s``). A client that leaves cancels its Ray request: the engine stops at its next frame.
* Slow clients: the app's checks and error shapes are the same (they are the app's); the connections are Ray's
  proxy's, which takes the server's ``keep_alive_s`` but has no whole-request deadline or connection limit as
  :mod:`.connections` gives uvicorn, and a replica's chunks wait in Ray's stream, not in a bounded :mod:`.relay`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import math
import os
import signal
import threading
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI
from ray import serve
from ray.exceptions import NodeDiedError, RayActorError, RayError, RayTaskError, WorkerCrashedError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    RayServeException,
    ReplicaUnavailableError,
)
from ray.serve.handle import DeploymentHandle

from ..checkpoint import DEFAULT_MODEL
from ..errors import Audio8Error, ConfigError
from ..request import CheckedRequest
from ..settings import DEFAULTS, RaySettings, ServerSettings
from ..tts import TTS
from ..voices import Voice, VoiceStore
from .app import create_app
from .errors import ApiError, api_error
from .metrics import Metrics, Spoken
from .ray_address import cannot_join, check_answers
from .ray_replicas import replicas_or_503
from .synth import LOCAL, LocalSynthesizer, Output, Speech, Synthesizer, failed

T = TypeVar("T")
log = logging.getLogger("audio8_coreai.server")

# A replica that died (its worker or node too) or cannot be reached: what it was asked was not done there, and
# another replica, or this one restarted, may do it.
LOST = (RayActorError, WorkerCrashedError, NodeDiedError, ReplicaUnavailableError, DeploymentUnavailableError)


def rows(server: ServerSettings) -> int:
    """Requests one Synth replica runs at once: its ``server.batch`` rows, or one utterance at a time."""
    return max(server.batch, 1)


def voice_key(voice: Voice) -> str:
    """``NAME@DIGEST``: the voice's multiplexed model id, DIGEST the first 16 hex digits of the SHA-256 of its codes
    (int16, as stored), transcript and checkpoint fingerprint. Voice names hold no ``@`` (voices.check_name)."""
    digest = hashlib.sha256(voice.codes.astype("<i2").tobytes())
    digest.update(f"\0{voice.transcript}\0{voice.fingerprint}".encode())
    return f"{voice.name}@{digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class SpeechJob:
    """One speech request sent to a Synth replica: the checked request without its voice, the voice's
    :func:`voice_key` ("" for the model's own voice) and how to make the body."""

    checked: CheckedRequest
    voice_key: str
    output: Output


@dataclass(frozen=True)
class Started:
    """A Synth stream's first item: its stream is built by ``replica``; ``tokens``: the text's token count;
    ``warning``: its plan's language warning (None: none)."""

    replica: str
    tokens: int
    warning: str | None


@dataclass(frozen=True)
class Finished:
    """A Synth stream's last item when its body ended whole: the ``frames`` made, its ``frame_cap`` note and what
    it adds to the ingress's counters (``spoken``, :class:`.metrics.Spoken`)."""

    frames: int | None
    frame_cap: str | None = None
    spoken: Spoken | None = None


@dataclass(frozen=True)
class Refused:
    """What a Synth call gives instead of its result or its stream's next item when the request is refused (a
    client's error, said by the ingress as the app says it): given, not raised, so that Ray does not log it as a
    failed request with a traceback."""

    error: ApiError


def _refused(e: Audio8Error | ApiError) -> Refused:
    return Refused(e if isinstance(e, ApiError) else api_error(e))


class Synth:
    """One engine (``server.batch`` rows of one model, or one instance) of ``cluster``'s checkpoint on this replica's
    device, making speech as ``audio8 serve`` does (:class:`.synth.LocalSynthesizer`). A refusal leaves it as a
    :class:`Refused` value (its ApiError picklable); anything else it raises."""

    def __init__(self, cluster: RaySettings, server: ServerSettings):
        model = cluster.model or DEFAULT_MODEL
        tts = TTS.load(model, device=cluster.device, precision=cluster.precision, voices_dir=cluster.voices)
        instances = tts.batched(server.batch)[1] if server.batch else [tts]
        settings = server.model_copy(update={"workers": len(instances), "max_queue": len(instances)})
        self.local = LocalSynthesizer(instances, settings, Metrics())  # Ray bounds what reaches it; a margin
        try:
            self.replica = serve.get_replica_context().replica_id.unique_id
            self.voice = self.kept_voice
        except RayServeException:  # Ray's local testing mode: no replica context, no multiplexing
            self.replica, self.voice = LOCAL, self.read_voice

    async def read_voice(self, key: str) -> Voice:
        """The stored voice of ``key`` (:func:`voice_key`) read from the shared store; raises ApiError 409 when it was
        replaced since the key was made, VoiceError when it is gone."""
        voice = self.local.voices.load(key.rsplit("@", 1)[0])
        if voice_key(voice) != key:
            message = f"voice {voice.name!r} was replaced while this request waited: send it again"
            raise ApiError(409, message, "voice", "voice_changed")
        return voice

    @serve.multiplexed(max_num_models_per_replica=DEFAULTS.torch.prefix_cache)
    async def kept_voice(self, key: str) -> Voice:
        """:meth:`read_voice`, kept by this replica while ``key`` is among its last ``prefix_cache`` voices (as its
        backend keeps their prompt heads); Ray sends the requests of ``key`` to the replicas that keep it."""
        return await self.read_voice(key)

    async def speak(self, job: SpeechJob) -> AsyncGenerator[Started | bytes | Finished | Refused, None]:
        """:class:`Started` once the stream is built, the body's bytes (:class:`.synth.Speech`), :class:`Finished`;
        or, where the request is refused (before the stream or within it), :class:`Refused` and nothing more."""
        try:
            checked = job.checked
            if job.voice_key:
                checked = dataclasses.replace(checked, voice=await self.voice(job.voice_key))
            speech = await self.local.open(checked, job.output)
        except (Audio8Error, ApiError) as e:
            yield _refused(e)
            return
        try:
            yield Started(self.replica, speech.tokens, speech.warning)
            async for data in speech.body:
                yield data
            yield Finished(speech.frames, speech.frame_cap, speech.spoken)
        except (Audio8Error, ApiError) as e:
            yield _refused(e)
        finally:
            await speech.body.aclose()  # also when the request is cancelled: the engine stops at its next frame

    async def register_voice(
        self, name: str, data: bytes, filename: str, transcript: str, replace: bool
    ) -> Voice | Refused:
        try:
            return await self.local.register_voice(name, data, filename, transcript, replace)
        except (Audio8Error, ApiError) as e:
            return _refused(e)

    async def info(self) -> dict[str, Any]:
        """What the app needs before its first request: the checkpoint's ``fingerprint`` and the fields of
        ``/health`` that do not change (model, backend, device, sample_rate, workers: this replica's rows)."""
        fixed = {k: v for k, v in (await self.local.health()).items() if k not in ("running", "queued", "max_queue")}
        return {**fixed, "fingerprint": self.local.fingerprint}


async def _remote(step: Awaitable[T | Refused]) -> T:
    """What a Synth call gives, its errors as the app says them: a full queue a 503 with Retry-After, a replica
    lost (:data:`LOST`; before a stream's first byte nothing was sent, so the client may send it again) a 503
    replica_unavailable with Retry-After, a :class:`Refused` its ApiError, anything else a 500."""
    try:
        given = await step
    except BackPressureError as e:
        wait = math.ceil(e.retry_after_s or DEFAULTS.ray.retry_after_s)
        raise ApiError(
            503,
            "the cluster is busy (every replica running, its queue full); retry later",
            code="queue_full",
            headers={"Retry-After": str(wait)},
        ) from None
    except LOST as e:
        log.warning("a replica was lost during a request: %s: %s", type(e).__name__, e)
        raise ApiError(
            503,
            "the cluster lost the replica serving this request (it stopped or cannot be reached; logged there): "
            "send the request again",
            code="replica_unavailable",
            headers={"Retry-After": str(math.ceil(DEFAULTS.ray.retry_after_s))},
        ) from None
    except RayTaskError as e:  # raised in a replica: its cause is what it raised
        raise failed(e.cause) from None
    except RayError as e:  # the request could not be placed, or Ray failed otherwise
        raise failed(e) from None
    if isinstance(given, Refused):
        raise given.error
    return given


class RaySynthesizer(Synthesizer):
    """The app's synthesizer on a cluster: speech and voice registration go to the Synth deployment behind
    ``synth``; ``voices`` is the shared store (read here for listing, checks and deletion); ``max_queue``: the
    requests Ray lets wait per ingress replica (``/health``); ``info``: what :meth:`Synth.info` says; ``app``: the
    Serve application whose Synth replicas ``/health`` counts (None: not counted, Ray's local testing mode)."""

    def __init__(
        self, synth: DeploymentHandle, voices: VoiceStore, max_queue: int, info: dict[str, Any], app: str | None = None
    ):
        self.synth, self.voices, self.max_queue, self.app = synth, voices, max_queue, app
        self.sample_rate, self.fingerprint = info["sample_rate"], info["fingerprint"]
        self.fixed = {k: v for k, v in info.items() if k != "fingerprint"}
        self.running = 0  # streams in flight through this ingress
        self.metrics = Metrics(queue=False)  # Ray's queue is not seen here

    async def open(self, checked: CheckedRequest, output: Output) -> Speech:
        voice = self.voices.load(checked.voice) if isinstance(checked.voice, str) else checked.voice
        key = voice_key(voice) if voice is not None else ""
        job = SpeechJob(dataclasses.replace(checked, voice=None), key, output)
        call = self.synth.options(stream=True, multiplexed_model_id=key).speak.remote(job)
        try:
            started = await _remote(anext(call))
        except asyncio.CancelledError:  # the client left while its request waited: Ray lets it go
            call.cancel()  # (not after an error: cancel() raises the call's own error again)
            raise
        speech = Speech(started.replica, started.tokens, started.warning)
        speech.body = self._body(call, speech)
        return speech

    async def _body(self, call, speech: Speech) -> AsyncGenerator[bytes, None]:
        self.running += 1
        try:
            while not isinstance(data := await _remote(anext(call)), Finished):
                yield data
            speech.frames, speech.frame_cap, speech.spoken = data.frames, data.frame_cap, data.spoken
            if data.spoken is not None:  # the replica's figures: its frames, TTFA and compute seconds
                self.metrics.finished(data.spoken, frames=True)
        except (GeneratorExit, asyncio.CancelledError):  # the client left: its replica stops at its next frame
            call.cancel()
            raise
        finally:
            self.running -= 1

    async def register_voice(self, name: str, data: bytes, filename: str, transcript: str, replace: bool) -> Voice:
        return await _remote(self.synth.register_voice.remote(name, data, filename, transcript, replace))

    async def health(self) -> dict[str, Any]:
        """Answered here, at once: a call to a replica would wait behind its speech (seconds to minutes, when a
        load balancer's probe must not). A replica's fixed fields (its rows as ``workers``), the streams through
        this ingress as ``running``, the cluster's ``max_queue``; ``queued`` is Ray's, not known here (None);
        ``replicas``: the Synth replicas running, from Ray's controller (raises the 503 ``no_replica`` for none)."""
        counted = {} if self.app is None else {"replicas": await replicas_or_503(self.app, "Synth")}
        return {**self.fixed, "running": self.running, "queued": None, "max_queue": self.max_queue, **counted}

    def load(self) -> tuple[int, int]:
        return self.running, 0  # what waits is Ray's queue, not this process's

    def close(self) -> None:
        pass  # the replicas are Ray's

    def drain(self) -> None:
        pass  # Ray's proxy and replicas stop themselves (graceful_shutdown_timeout_s)

    def cut(self) -> None:
        pass


class Ingress:
    """The HTTP side: the app of ``audio8 serve`` under ``server`` over :class:`RaySynthesizer` (built on the
    replica), ``cluster.voices`` its voice store."""

    def __init__(self, synth: DeploymentHandle, cluster: RaySettings, server: ServerSettings):
        self.synth, self.cluster, self.server = synth, cluster, server

    async def __serve_build_asgi_app__(self) -> FastAPI:
        server, info = self.server, await _remote(self.synth.info.remote())
        app = serve.get_replica_context().app_name
        synth = RaySynthesizer(self.synth, VoiceStore(self.cluster.voices), server.max_queue, info, app)
        return create_app(synth, server, proxy_ids=True)  # Ray's proxy answers with the request's x-request-id


SynthDeployment = serve.deployment(Synth, name="Synth")
IngressDeployment = serve.deployment(serve.ingress()(Ingress), name="Ingress")


# The server fields a Serve config sets in Ray's own terms: where the API listens, and how many requests run at once.
RAYS_SERVER_FIELDS = {
    "host": "http_options: host",
    "port": "http_options: port",
    "keep_alive_s": "http_options: keep_alive_timeout_s",
    "workers": "replicas (or autoscale) and server: batch",
}


def build_app(args: dict[str, Any]) -> serve.Application:
    """The Ray application of ``args``, ``deploy/serve_config.yaml``'s (whose import path this is): the ``ray``
    group's fields (:class:`..settings.RaySettings`) and ``server``, the HTTP server's
    (:class:`..settings.ServerSettings`, ``batch`` the rows of each replica), each over its group of
    :data:`..settings.DEFAULTS` (the AUDIO8_* environment's). Raises pydantic's ValidationError for a field that is
    wrong or unknown, ValueError for a server field Ray's own options set (:data:`RAYS_SERVER_FIELDS`)."""
    fields = dict(args)
    given = fields.pop("server", {})
    for name in given.keys() & RAYS_SERVER_FIELDS:  # silently ignored, they left the API where it was
        raise ValueError(f"server: {name} is Ray's under Ray Serve: set {RAYS_SERVER_FIELDS[name]} instead")
    server = ServerSettings(**{**dict(DEFAULTS.server), **given})
    return application(RaySettings(**{**dict(DEFAULTS.ray), **fields}), server)


def application(cluster: RaySettings, server: ServerSettings) -> serve.Application:
    """The Ray application: ``cluster.replicas`` Synth replicas, or ``cluster.autoscale`` on requests in flight
    aiming at :func:`rows` per replica, each running that many requests at once, behind one ingress."""
    if cluster.autoscale is None:
        scale: dict[str, Any] = {"num_replicas": cluster.replicas}
    else:
        low, high = cluster.autoscale
        scale = {
            "autoscaling_config": {"min_replicas": low, "max_replicas": high, "target_ongoing_requests": rows(server)}
        }
    synth = SynthDeployment.options(
        graceful_shutdown_timeout_s=server.shutdown_s,  # a replica stopped finishes its streams for this long
        max_ongoing_requests=rows(server),
        max_queued_requests=max(server.max_queue, 1),  # Ray: at least 1 (-1 is no limit)
        backpressure_config={"retry_after_s": cluster.retry_after_s},
        ray_actor_options={"num_gpus": cluster.gpus, "num_cpus": cluster.cpus},
        **scale,
    ).bind(cluster, server)
    # No CPU reserved for the ingress (it waits on Synth, as Ray's proxy does): N replicas fit N cores.
    ingress = IngressDeployment.options(
        graceful_shutdown_timeout_s=server.shutdown_s,
        max_ongoing_requests=cluster.ingress_requests,
        ray_actor_options={"num_cpus": 0},
    )
    return ingress.bind(synth, cluster, server)


def run_on_ray(cluster: RaySettings, server: ServerSettings, address: str | None = None) -> None:
    """``audio8 serve --ray``: join the Ray cluster at ``address`` ("auto": the one this machine belongs to; None:
    the one ``RAY_ADDRESS`` names, else a new instance here, never a cluster ``ray start`` began here, whose
    ``audio8`` app this would replace), serve :func:`application` behind Ray's HTTP proxy on
    ``server.host:server.port``, and block until interrupted. Raises ConfigError when there is no cluster to join
    at the address."""
    import ray

    joining = address or os.environ.get("RAY_ADDRESS")
    if joining and joining != "auto":
        check_answers(joining)
    heard = signal.getsignal(signal.SIGTERM)  # the command's handler, which ray.init replaces with one that exits
    try:
        ray.init(address=joining or "local")  # "local": Ray's word for a new instance
    except (ConnectionError, ValueError) as e:  # no cluster there, or no Ray address (a dashboard's http:// URL)
        said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if not joining:
            raise ConfigError(f"cannot start a Ray instance on this machine ({said})") from None
        raise cannot_join(joining, said) from None
    if callable(heard):
        signal.signal(signal.SIGTERM, heard)
    http = {"host": server.host, "port": server.port, "keep_alive_timeout_s": server.keep_alive_s}
    serve.start(http_options=http)
    try:
        serve.run(application(cluster, server), name="audio8", route_prefix="/", blocking=True)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: streams still running get server.shutdown_s, then Ray stops
        if joining:
            raise
        log.warning("stopping: answers still running get %.0f s to finish", server.shutdown_s)
        # In a thread, for at most that long and a margin: a SIGTERM to the whole process group (systemd, timeout,
        # kill -- -PGID) stops this instance's Ray processes too, and serve.delete then waited 60 s for them
        deleting = threading.Thread(target=serve.delete, args=("audio8",), daemon=True)
        deleting.start()
        deleting.join(server.shutdown_s + 5.0)
        if deleting.is_alive():
            log.warning("stopping: this Ray instance stopped with the command (its process group was signalled)")
        raise
