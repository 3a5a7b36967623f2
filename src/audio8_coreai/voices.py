"""The voice store: cloned voices saved by name, for ``audio8 say --voice NAME`` (DESIGN.md, voices.py).

A voice is what the clone prompt needs from a reference clip (SPEC.md section 5): the clip's codes int
[num_codebooks, T] from the codec encoder and its transcript; with where it came from (the source sample rate
and duration, the file), the fingerprint of the checkpoint whose codec made the codes, and when.

On disk, one file per voice: ``<folder>/<NAME>.npz``, a NumPy zip read without pickles, holding ``codes``
(int16 [num_codebooks, T]; codes are < 4096) and ``meta`` (one JSON string: ``format``, ``name``,
``transcript``, ``sample_rate``, ``duration_s``, ``fingerprint``, ``created``, ``source``, ``warnings``, and
``codebooks`` and ``codebook_size``, the codes' shape and range as the codec that made them gives them: a file
whose codes break them is damaged, found when it is read, not after a model has loaded; 0 in a file stored before
they were recorded).
One file per voice makes a write atomic: it is written under a temporary name that starts with a dot, flushed
to disk, then renamed over ``NAME.npz`` (``os.replace``); a new voice without ``replace`` is linked into place only
if its name is still free, so of two writers racing for one new name exactly one wins. A crash at any point leaves
the old voice (if any) whole, plus at most a dot-file that listing and loading never look at, and that opening the
store removes once it is ``stale_temp_s`` old (settings.py).

The folder is the per-user data folder (``platformdirs``; ``~/.local/share/audio8-coreai/voices`` on Linux,
``~/Library/Application Support/audio8-coreai/voices`` on macOS) unless one is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import errno
import fcntl
import json
import os
import shlex
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import platformdirs

from .audio import publish
from .errors import AudioError, DamagedVoice, PromptError, VoiceError, VoiceExists, VoiceStorageError
from .settings import DEFAULTS
from .text.checks import check_text
from .values import check_switch
from .voice_rules import DEFAULT_VOICE, FIELD_KINDS, WHOLE_FIELDS, check_name, codes_problem

FORMAT = 1  # the on-disk format version in ``meta``; a newer file is refused rather than misread
SUFFIX = ".npz"
TEMP_SUFFIX = ".tmp"  # a voice being written: ``.NAME.XXXXXXXX.tmp``


def check_voice_choice(voice: object, ref_audio: object, ref_text: object) -> None:
    """Raise VoiceError unless an utterance asks for at most one voice: a stored ``voice``, or a one-off
    clip ``ref_audio`` with its transcript ``ref_text`` (both or neither)."""
    if ref_audio is None and ref_text is None:
        return
    if voice is not None:
        raise VoiceError("give either a voice (--voice) or a reference clip (--ref-audio with --ref-text), not both")
    if ref_audio is None or ref_text is None:
        raise VoiceError(
            "one-off cloning needs both the clip (--ref-audio; ref_audio in Python) and its "
            "transcript (--ref-text; ref_text)"
        )


def default_voices_dir() -> Path:
    """The per-user voices folder (``platformdirs.user_data_path('audio8-coreai') / 'voices'``)."""
    return platformdirs.user_data_path("audio8-coreai", appauthor=False) / "voices"


@dataclass(frozen=True, eq=False)
class Voice:
    """A cloned voice: ``codes`` int64 [num_codebooks, T] (T frames of 2048 samples at 44.1 kHz) and the
    clip's ``transcript``; the source clip's ``sample_rate`` (Hz) and ``duration_s`` (seconds); the
    ``fingerprint`` of the checkpoint whose codec made the codes (:meth:`Checkpoint.fingerprint`);
    ``created`` (ISO 8601, UTC); ``source`` (the clip's path) and the reader's ``warnings``. ``name`` is
    empty for a one-off voice that is not stored. ``codebooks`` and ``codebook_size``: the codes' rows and range
    [0, codebook_size) as that checkpoint's codec makes them (0: not known), checked when the voice is stored and
    read."""

    codes: np.ndarray = field(repr=False)  # the repr: the voice's figures, not its codes
    transcript: str
    sample_rate: int
    duration_s: float
    fingerprint: str
    created: str
    name: str = ""
    source: str = ""
    warnings: tuple[str, ...] = ()
    codebooks: int = 0
    codebook_size: int = 0

    @property
    def frames(self) -> int:
        return int(self.codes.shape[1])

    def check_checkpoint(self, fingerprint: str) -> None:
        """Raise :class:`VoiceError` unless this voice was made with the checkpoint of ``fingerprint``.

        Codes mean something only to the codec that made them (and the model trained with it): another
        checkpoint reads them as a different sound, so the clone would be wrong without any error.
        """
        if self.fingerprint == fingerprint:
            return
        label = f"voice {self.name!r}" if self.name else "this voice"
        clip = f" (its clip was {self.source})" if self.source else ""
        raise VoiceError(
            f"{label} was made with another checkpoint (fingerprint {self.fingerprint[:12]}; this "
            f"model's is {fingerprint[:12]}), and reference codes only fit the codec that made "
            f"them: register it again with this model{clip}, e.g. `audio8 voice add "
            f"{self.name or 'NAME'} --audio CLIP --text TRANSCRIPT --force`"
        )

    def problem(self) -> str | None:
        """What makes this voice one that cannot be stored or spoken, or None: a field of the wrong type or range
        (whole numbers >= 0, a sample rate >= 1, a finite duration, texts, warnings a tuple of texts), its codes
        (:func:`codes_problem`) or a transcript with no words. Checked alike when a voice is saved and read."""
        for name, kind in FIELD_KINDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kind[0]) or not kind[1](value):
                return f"{name} {value!r} is not {kind[2]}"
        if not isinstance(self.warnings, (tuple, list)) or not all(isinstance(w, str) for w in self.warnings):
            return f"warnings {self.warnings!r} are not a list of texts"
        if problem := codes_problem(np.asarray(self.codes), self.codebooks, self.codebook_size):
            return problem
        try:  # its transcript is spoken before every text: a voice that holds none cannot be spoken with
            check_text(self.transcript, "its transcript")
        except PromptError as e:
            return str(e)
        return None

    def meta(self) -> dict:
        """Everything but the codes, as stored in the file's ``meta`` JSON."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "codes"}
        fields = {k: v.item() if isinstance(v, np.generic) else v for k, v in fields.items()}  # numpy numbers
        return {"format": FORMAT, **fields, "warnings": list(self.warnings)}


def now_utc() -> str:
    """The current time as ISO 8601 UTC to the second (``Voice.created``)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


class VoiceStore:
    """Voices saved by name in one folder (see the module docstring for the format).

    ``folder`` None means :func:`default_voices_dir`. The folder is created on the first save; reading an
    absent folder finds no voices. Opening it removes the temporary files of writes that crashed (older than
    ``DEFAULTS.server.stale_temp_s``; a younger one may be another process's write in progress). Raises VoiceError
    for a folder that is not a path, or a path that is a file (it found no voices there, naming the file).
    """

    def __init__(self, folder: str | Path | None = None):
        if folder is not None and not isinstance(folder, (str, os.PathLike)):
            raise VoiceError(f"the voices folder must be a path (str or Path), got {type(folder).__name__}")
        self.root = Path(folder).expanduser() if folder is not None else default_voices_dir()
        if self.root.exists() and not self.root.is_dir():
            instead = "give a folder (--voices DIR, voices_dir=)" + (", or none for the per-user one" if folder else "")
            raise VoiceError(f"the voices folder {self.root} is a file, not a folder: {instead}")
        self._sweep()

    def _option(self) -> str:
        """The ``--voices`` option naming this store in a command the user is told to run ("" for the per-user
        one, the default): a hint without it acted on the default store."""
        return "" if self.root == default_voices_dir() else f" --voices {shlex.quote(str(self.root))}"

    def _sweep(self) -> None:
        """Remove temporary voice files older than ``DEFAULTS.server.stale_temp_s``; a store that cannot be changed
        keeps them (listing and loading skip them anyway)."""
        stale = time.time() - DEFAULTS.server.stale_temp_s
        try:
            for p in self.root.glob("." + "*" + TEMP_SUFFIX):
                if p.is_file() and p.stat().st_mtime < stale:
                    p.unlink()
        except OSError:
            pass

    def path(self, name: str) -> Path:
        """The file of voice ``name`` (validated; raises VoiceError for a bad name)."""
        return self.root / (check_name(name) + SUFFIX)

    def find(self, name: str) -> Path | None:
        """The file of stored voice ``name`` as names are kept, one voice whatever their case (:meth:`check_new`):
        its own file, else the one whose name differs only in case; None when there is none. Raises VoiceError for a
        bad name."""
        path = self.path(name)
        if path.is_file():
            return path
        twin = next((n for n in self.names() if n.casefold() == name.casefold()), None)
        return None if twin is None else self.path(twin)

    def names(self) -> list[str]:
        """The stored voices' names, sorted. Temporary dot-files and files with invalid names are skipped."""
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.glob("*" + SUFFIX):
            if not p.is_file():  # a folder named like a voice file is none
                continue
            try:
                found.append(check_name(p.name[: -len(SUFFIX)]))
            except VoiceError:
                continue
        return sorted(found)

    def check_new(self, name: str, replace: bool = False) -> Path:
        """The file a new voice ``name`` would take; raises VoiceError for a bad name, one already taken unless
        ``replace``, or a folder that cannot hold it, ConfigError for a ``replace`` not True or False (a text such
        as ``'false'`` would overwrite). Callers check before minutes of work; :meth:`save` checks again."""
        replace = check_switch("replace", replace)
        target = self.path(name)
        if target.stem.lower() == DEFAULT_VOICE:  # a request naming it would get the server's default voice
            raise VoiceError(
                f"{target.stem!r} names the default voice in a server's requests: give the voice another name"
            )
        # On macOS's and Windows' disks names differing in case are one file: keep stores portable.
        twin = next((n for n in self.names() if n != name and n.casefold() == name.casefold()), None)
        if twin is not None:
            raise VoiceExists(
                f"a voice named {twin!r} already exists in {self.root}, and names that differ only in "
                f"case are one file on macOS and Windows disks: choose another name, or remove "
                f"{twin!r} first (audio8 voice rm)",
                twin,
            )
        existing = self.root
        while not existing.exists() and existing != existing.parent:  # the folder is made on the first save
            existing = existing.parent
        if not existing.is_dir() or not os.access(existing, os.W_OK):
            raise VoiceStorageError(
                f"cannot store voices in {self.root}: {existing} is "
                f"{'not a folder' if not existing.is_dir() else 'not writable'}; give another folder "
                "(--voices DIR, voices_dir=...)"
            )
        if target.exists() and not replace:
            raise self._exists(name)
        return target

    def _exists(self, name: str) -> VoiceExists:
        return VoiceExists(
            f"a voice named {name!r} already exists in {self.root}: choose another name, "
            f"or replace it (audio8 voice add --force, replace=True in Python, "
            "replace=true in POST /v1/voices)",
            name,
        )

    def save(self, voice: Voice, replace: bool = False) -> Path:
        """Write ``voice`` under ``voice.name`` atomically; returns its file.

        Raises VoiceError: bad name or codes; VoiceExists: the name is taken (also by a writer that won a race
        for it) and ``replace`` is False; VoiceStorageError: the folder or file cannot be written (the message
        names it; ``full`` for a full disk). On any failure the previous voice of that name, if any, is unchanged
        and no temporary file is left.
        """
        target = self.check_new(voice.name, replace)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            message = f"cannot create the voices folder {self.root}: {e}; give another with --voices DIR"
            raise _storage_error(message, e) from e
        codes = np.asarray(voice.codes)
        problem = voice.problem()
        if problem is None and codes.max() >= 1 << 15:
            problem = f"code {int(codes.max())} is over 32767, which a voice file (int16) cannot hold"
        if problem:
            raise VoiceError(f"voice {voice.name!r}: {problem}")
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{voice.name}.", suffix=TEMP_SUFFIX, dir=self.root)
            with os.fdopen(fd, "wb") as f:
                np.savez(f, codes=codes.astype(np.int16), meta=np.array(json.dumps(voice.meta(), ensure_ascii=False)))
                f.flush()
                os.fsync(f.fileno())  # the bytes reach the disk before the rename makes them the voice
            with self._writers_alone():  # across processes: a name differing only in case may be stored since
                self.check_new(voice.name, replace)
                publish(tmp, target, replace=replace)
            tmp = None
        except FileExistsError:
            raise self._exists(voice.name) from None
        except (OSError, AudioError) as e:
            raise _storage_error(f"cannot write voice {voice.name!r} to {target}: {e}", e) from e
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
        return target

    @contextlib.contextmanager
    def _writers_alone(self) -> Iterator[None]:
        """One writer of this store at a time, across processes (two CLIs, a CLI and a server, Ray's replicas): an
        exclusive ``flock`` on its folder, so a check for a twin by case and the publish are one step. Where the
        folder cannot be locked (NFS emulates flock with locks a folder opened to read cannot take; a folder
        without read permission), writers go on unlocked, as before: only names differing in case can race."""
        fd = None
        try:
            fd = os.open(self.root, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # releases the lock

    def load(self, name: str, fingerprint: str | None = None) -> Voice:
        """Read voice ``name`` (:meth:`find`: whatever its case); with ``fingerprint``, also refuse one made with
        another checkpoint.

        Raises VoiceError: bad name, no such voice (the message suggests close names), a damaged or newer
        file, or a fingerprint mismatch (:meth:`Voice.check_checkpoint`).
        """
        path = self.find(name)
        if path is None:
            name = check_name(name)
            close = difflib.get_close_matches(name, self.names(), n=3)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise VoiceError(
                f"no voice named {name!r} in {self.root}{hint}; `audio8 voice list` shows the voices "
                "(another folder: --voices DIR, voices_dir= in Python)"
            )
        name = path.name[: -len(SUFFIX)]
        damaged = f"; remove it (`audio8 voice rm {name}{self._option()}`) and add it again"
        if not zipfile.is_zipfile(path):  # else np.load guesses a pickle and blames allow_pickle
            raise DamagedVoice(f"voice file {path} is damaged (not a NumPy zip archive){damaged}", name)
        try:
            with np.load(path, allow_pickle=False) as f:
                codes, meta = f["codes"], json.loads(str(f["meta"]))
        except Exception as e:  # zip, key, JSON and value errors alike mean a damaged file
            raise DamagedVoice(f"voice file {path} is damaged ({type(e).__name__}: {e}){damaged}", name) from e
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            version = meta.get("format") if isinstance(meta, dict) else None
            raise DamagedVoice(
                f"voice file {path} has format {version!r}, this version reads format {FORMAT}: "
                f"upgrade audio8-coreai, or{damaged.removeprefix(';')}",
                name,
            )
        try:
            warnings = meta.get("warnings", [])
            voice = Voice(
                codes=codes if codes.dtype.kind not in "iu" else codes.astype(np.int64),
                transcript=meta["transcript"],
                sample_rate=meta["sample_rate"],
                duration_s=meta["duration_s"],
                fingerprint=meta["fingerprint"],
                created=meta["created"],
                name=name,
                source=meta.get("source", ""),
                warnings=tuple(warnings) if isinstance(warnings, list) else warnings,
                codebooks=meta.get("codebooks", 0),
                codebook_size=meta.get("codebook_size", 0),
            )
        except KeyError as e:
            raise DamagedVoice(f"voice file {path} is damaged (meta holds no {e}){damaged}", name) from e
        if problem := voice.problem():
            raise DamagedVoice(f"voice file {path} is damaged ({problem}){damaged}", name)
        whole = {k: int(getattr(voice, k)) for k in WHOLE_FIELDS}  # 44100.0 in a hand-made file is 44100
        voice = dataclasses.replace(voice, **whole, duration_s=float(voice.duration_s))
        if fingerprint is not None:
            voice.check_checkpoint(fingerprint)
        return voice

    def remove(self, name: str) -> Path:
        """Delete voice ``name``; returns the removed file. Raises VoiceError if there is none, VoiceStorageError if it
        cannot."""
        path = self.find(name) or self.path(name)
        try:
            if path.is_dir():  # not a voice: left alone, reported as absent
                raise FileNotFoundError(path)
            path.unlink()
        except FileNotFoundError:
            raise VoiceError(f"no voice named {name!r} in {self.root}; `audio8 voice list` shows the voices") from None
        except OSError as e:
            raise _storage_error(f"cannot remove voice {name!r} ({path}): {e}", e) from e
        return path


def _storage_error(message: str, e: OSError | AudioError) -> VoiceStorageError:
    """VoiceStorageError for the failed write ``e`` (an OSError, or an AudioError caused by one): ``full`` for a
    full disk or quota."""
    cause = e if isinstance(e, OSError) else e.__cause__
    full = isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)
    return VoiceStorageError(message, full)
