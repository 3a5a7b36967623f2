"""Writing audio files: whole (:func:`write_audio`) or as it is made (:func:`open_audio_writer`), each finished
file put in place by one atomic :func:`publish`."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import platform
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf

from ..errors import AudioError
from .samples import HOLD_NO_EMPTY, check_some, mono_samples, sample_rate_of

# Formats written by extension; soundfile (libsndfile) encodes them all.
WRITE_FORMATS = {".wav": ("WAV", "FLOAT"), ".flac": ("FLAC", "PCM_24"), ".ogg": ("OGG", "VORBIS")}


def write_audio(path: str | Path, audio: np.ndarray, sample_rate: int) -> Path:
    """Write mono float32 ``audio`` [N] (in [-1, 1]) at ``sample_rate`` Hz to ``path``.

    The format follows the extension: ``.wav`` (32-bit float), ``.flac`` (24-bit), ``.ogg`` (Vorbis).
    The file is written beside its target under a temporary name and renamed into place, so an
    interrupted write never leaves a truncated file and never clobbers an existing one half-way.

    Raises:
        AudioError: unknown extension, a missing or unwritable folder, or a path that is a folder; audio not mono
        or not finite (:func:`.samples.mono_samples`), no samples for a .flac (:func:`.samples.check_some`), a
        ``sample_rate`` no whole number.
    """
    path, folder = check_writable(path)
    ext = path.suffix.lower()
    fmt, subtype = WRITE_FORMATS[ext]
    data, sample_rate = mono_samples(audio), sample_rate_of(sample_rate)
    check_some(data, ext.removeprefix("."))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=ext, dir=folder)
        os.close(fd)
        sf.write(os.fsencode(tmp), data, sample_rate, format=fmt, subtype=subtype)  # bytes: any file name
        publish(tmp, path)
    except (OSError, sf.LibsndfileError) as e:
        raise _write_error(path, folder, e) from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _write_error(path: Path, folder: Path, e: BaseException, midway: bool = False) -> AudioError:
    """AudioError for a failed write of ``path``, saying why where it can: a full disk (libsndfile says only
    'System error.' then: the folder's free space tells), a file size limit (EFBIG: ``ulimit -f``, a FAT disk's
    4 GB); ``midway``: a write that failed after others succeeded (a stream's), whose 'System error.' is one of
    those or a failing disk."""
    try:
        usage = shutil.disk_usage(folder)
        full = usage.total > 0 and usage.free < 1 << 20  # a pseudo file system (/proc) has no size at all
    except OSError:
        full = False
    code = e.errno if isinstance(e, OSError) else None
    if full or code in (errno.ENOSPC, errno.EDQUOT):
        why = " (the disk is full: free some space or write elsewhere)"
    elif code == errno.EFBIG:
        why = " (the file is over the size limit for a file here: write elsewhere, or speak less at once)"
    elif code in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS):  # e.g. /proc, a read-only mount
        why = f" (no file can be made in {folder}: write elsewhere)"
    elif midway and code is None:
        why = (
            " (the disk or a quota is full, a file size limit was reached, or the disk failed: free some space or "
            "write elsewhere)"
        )
    else:
        why = ""
    # the OS's words without the file name it gives: that is the hidden temporary file's, not the user's
    reason = e.strerror if isinstance(e, OSError) and e.strerror else e
    return AudioError(f"cannot write {path}: {reason}{why}")


def check_writable(path: str | Path) -> tuple[Path, Path]:
    """``(path, its folder)`` if an audio file can be written there (see :func:`write_audio`), else AudioError."""
    path = Path(path).expanduser()
    if path.is_dir():  # whatever its name ends with
        raise AudioError(f"{path} is a folder: give a file name such as {path / 'speech.wav'}")
    if path.suffix.lower() not in WRITE_FORMATS:
        raise AudioError(f"cannot write {path}: use a .wav, .flac or .ogg file name")  # the path whole: /dev/full
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise AudioError(f"cannot write {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise AudioError(f"cannot write {path}: no permission to write in {folder}")
    return path, folder


def partial_path(path: str | Path) -> Path:
    """Where :func:`open_audio_writer` grows the audio for ``path``: ``.NAME.partial.EXT`` beside it."""
    path = Path(path)
    return path.parent / f".{path.stem}.partial{path.suffix}"


@contextlib.contextmanager
def open_audio_writer(path: str | Path, sample_rate: int) -> Iterator[_ChunkWriter]:
    """Write mono audio at ``sample_rate`` Hz to ``path`` chunk by chunk, as it is made (``say --stream``).

    Formats as :func:`write_audio`. The audio grows in ``.NAME.partial.EXT`` beside ``path`` with every
    ``write(chunk float32 [n])`` (call ``flush()`` after each to keep a wav's header sizes current, so the file so
    far plays) and becomes ``path`` when the block ends without an error; an interrupted run (an exception in the
    block) leaves ``path`` as it was (an existing file is never clobbered) and the audio made until then in the
    partial file, which is removed when it holds none. A write that fails (a full disk, a file size limit) removes
    the partial file too, the space it took given back, and raises AudioError naming ``path``.
    Raises AudioError as :func:`write_audio`.
    """
    path, folder = check_writable(path)
    fmt, subtype = WRITE_FORMATS[path.suffix.lower()]
    sample_rate = sample_rate_of(sample_rate)
    partial = partial_path(path)
    try:
        f = sf.SoundFile(os.fsencode(partial), "w", sample_rate, 1, subtype, format=fmt)
    except (OSError, sf.LibsndfileError) as e:
        raise _write_error(path, folder, e) from e  # the user's file name, not the hidden partial one
    writer = _ChunkWriter(f, path, folder)
    try:
        try:
            yield writer
        finally:
            writer.close()
    except BaseException:
        if writer.failed or f.frames == 0:  # a file the disk did not take, or nothing made: none to keep
            partial.unlink(missing_ok=True)
        raise
    fmt = path.suffix.lower().removeprefix(".")
    if f.frames == 0 and fmt in HOLD_NO_EMPTY:  # a flac of no samples is no readable file: none published
        partial.unlink(missing_ok=True)
        check_some(np.zeros(0, np.float32), fmt)
    publish(partial, path)


class _ChunkWriter:
    """:func:`open_audio_writer`'s file: ``write(chunk)``, ``flush()`` and ``frames`` of a ``soundfile.SoundFile``,
    whose failures (a full disk mid-stream) raise AudioError naming ``path``, the user's file, and set ``failed``."""

    def __init__(self, f: sf.SoundFile, path: Path, folder: Path):
        self._f, self._path, self._folder = f, path, folder
        self.failed = False

    @property
    def frames(self) -> int:
        return self._f.frames

    def write(self, chunk: np.ndarray) -> None:
        self._call(self._f.write, mono_samples(chunk))

    def flush(self) -> None:
        self._call(self._f.flush)

    def close(self) -> None:
        """Close the file (its header's sizes written); after a failed write quietly: that error is the one to
        tell."""
        if self.failed:
            with contextlib.suppress(OSError, sf.LibsndfileError):
                self._f.close()
        else:
            self._call(self._f.close)

    def _call(self, fn, *args) -> None:
        try:
            fn(*args)
        except (OSError, sf.LibsndfileError) as e:
            self.failed = True
            raise _write_error(self._path, self._folder, e, midway=True) from e


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it; done once, at import, before any thread writes files
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def publish(tmp: str | Path, path: Path, replace: bool = True) -> None:
    """Rename the finished file ``tmp`` over ``path`` (atomic), with the usual permissions (0666 less the
    umask; ``mkstemp`` makes its files owner-only). ``replace`` False: only if ``path`` is absent, else
    FileExistsError (create-if-absent, atomic: of two writers racing for one new name, one wins). Raises AudioError
    (its cause the OSError) when it cannot."""
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        if replace:
            os.replace(tmp, path)
        else:
            _claim(tmp, path)
    except FileExistsError:
        raise
    except OSError as e:
        raise AudioError(f"cannot write {path}: {e}") from e


_CLAIMING = threading.Lock()


def _claim(tmp: str | Path, path: Path) -> None:
    """Move ``tmp`` to ``path`` unless ``path`` exists (FileExistsError): a hard link then an unlink, atomic across
    processes; on a file system without hard links (FAT, exFAT) a check and rename under this process's lock."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        with _CLAIMING:
            if os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
            os.replace(tmp, path)
        return
    os.unlink(tmp)


def _staging_name(out: Path, kind: str) -> Path:
    """``.NAME.KIND-HOST-PID-RANDOM`` beside ``out``: whose it is, so a later staging can tell it was left behind."""
    return out.parent / f".{out.name}.{kind}-{platform.node() or 'host'}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_left_behind(out: Path) -> list[Path]:
    """Remove the staging folders of ``out`` (:func:`staged_folder`) that a process of this machine left when it was
    killed outright (SIGKILL, the OOM killer, a power cut: no unwinding removed them); returns them. Another
    machine's (a shared disk) and those of processes still running are kept."""
    host = platform.node() or "host"
    left = []
    for kind in ("partial", "old"):
        for path in out.parent.glob(f".{glob.escape(out.name)}.{kind}-{glob.escape(host)}-*-*"):
            pid = path.name[len(f".{out.name}.{kind}-{host}-") :].split("-")[0]
            if pid.isdigit() and not _alive(int(pid)) and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
                left.append(path)
    return left


@contextlib.contextmanager
def staged_folder(out: Path, replace: bool = False, merge: bool = False) -> Iterator[Path]:
    """A hidden sibling folder to write into; when the block ends it becomes ``out`` (which must be absent or an
    empty folder, or with ``replace`` a folder whose files are all to go: moved aside by one rename, then removed)
    by one rename, and when the block raises it is removed: a reader never sees half a folder. With ``merge``,
    ``out`` may hold other entries (none of the names written): each entry written moves in by a rename of its own,
    so a reader sees each one whole or not at all. What an earlier staging of ``out`` left when its process was
    killed outright is removed first (:func:`clear_left_behind`)."""
    clear_left_behind(out)
    tmp = _staging_name(out, "partial")
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if merge and out.is_dir():
            for entry in sorted(tmp.iterdir()):
                entry.rename(out / entry.name)
            tmp.rmdir()
            return
        if out.exists() and replace:
            old = _staging_name(out, "old")
            out.rename(old)
        elif out.exists():
            out.rmdir()  # empty (the caller checked); rename needs the name free
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
