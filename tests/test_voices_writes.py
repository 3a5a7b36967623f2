"""The voice store's writes: atomic, a killed write leaving no half voice, racing writers (one name, or names
differing only in case, across processes), storage faults as their own errors."""

from __future__ import annotations

import errno
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from audio8_coreai.errors import VoiceError, VoiceExists, VoiceStorageError
from audio8_coreai.settings import DEFAULTS
from audio8_coreai.voices import VoiceStore
from tests.test_voices import make_voice


def test_writers_racing_with_names_differing_in_case_store_one(tmp_path, monkeypatch):
    """Two writers (two processes: a CLI and a server) each passed the twin check before either published: the
    check and the publish are one step under the store's flock, so the second finds the first's voice. Here the
    first waits inside its publish while the second writes (separate flocks exclude each other in one process too)."""
    import audio8_coreai.voices as voices_module

    first_in, go_on = threading.Event(), threading.Event()
    real = voices_module.publish

    def slow_first(tmp, target, replace=True):
        if target.name == "Bob.npz":
            first_in.set()
            go_on.wait(30)
        real(tmp, target, replace=replace)

    monkeypatch.setattr(voices_module, "publish", slow_first)
    store = VoiceStore(tmp_path)
    first = threading.Thread(target=store.save, args=(make_voice("Bob"),))
    first.start()
    assert first_in.wait(30)
    second: list = []

    def save_second():
        try:
            store.save(make_voice("bob", seed=2))
        except VoiceExists as e:
            second.append(e)

    racer = threading.Thread(target=save_second)
    racer.start()
    racer.join(0.5)  # it waits for the first's publish (without the lock: it had published 'bob' by now)
    go_on.set()
    first.join(30)
    racer.join(30)
    assert store.names() == ["Bob"] and len(second) == 1 and "differ only in case" in str(second[0])


@pytest.mark.parametrize("existing", [False, True])
def test_a_crash_between_write_and_rename_leaves_no_half_voice(tmp_path, monkeypatch, existing):
    store = VoiceStore(tmp_path)
    if existing:
        store.save(make_voice(seed=1))
    before = sorted(os.listdir(tmp_path))

    def crash(src, dst):
        assert os.path.getsize(src) > 0  # the new voice was fully written under its temporary name
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(VoiceError, match="cannot write voice 'alice'.*No space left"):
        store.save(make_voice(seed=2), replace=True)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before  # the temporary file is gone too
    if existing:
        assert np.array_equal(store.load("alice").codes, make_voice(seed=1).codes)
    else:
        assert store.names() == []


def test_leftovers_of_a_killed_write_are_ignored(tmp_path):
    store = VoiceStore(tmp_path)
    store.save(make_voice("alice"))
    whole = (tmp_path / "alice.npz").read_bytes()
    # What a process killed mid-write leaves: a truncated temporary file beside the voices.
    (tmp_path / ".bob.k3j2h1.tmp").write_bytes(whole[: len(whole) // 2])
    (tmp_path / ".alice.x9y8z7.tmp").write_bytes(whole[:100])
    assert store.names() == ["alice"]
    assert np.array_equal(store.load("alice").codes, make_voice("alice").codes)
    with pytest.raises(VoiceError, match="no voice named 'bob'"):
        store.load("bob")


def test_stale_leftovers_of_a_killed_write_are_swept_when_the_store_opens(tmp_path):
    """Temporary files older than ``stale_temp_s`` are a crashed write's; a fresh one may be another process's
    write in progress and is kept."""
    VoiceStore(tmp_path).save(make_voice("alice"))
    old, fresh = tmp_path / ".bob.k3j2h1.tmp", tmp_path / ".carol.a1b2c3.tmp"
    old.write_bytes(b"half a voice")
    fresh.write_bytes(b"being written")
    hour_ago = time.time() - DEFAULTS.server.stale_temp_s - 60
    os.utime(old, (hour_ago, hour_ago))
    store = VoiceStore(tmp_path)
    assert not old.exists() and fresh.exists() and store.names() == ["alice"]


def test_two_writers_racing_for_one_new_name_one_wins(tmp_path):
    """Create-if-absent is atomic: of threads saving one new name at once without replace, exactly one writes and
    the others get VoiceExists; the stored voice is the winner's, whole."""
    store = VoiceStore(tmp_path)
    for round_ in range(5):
        name = f"race{round_}"
        start = threading.Barrier(4)

        def save(seed, name=name, start=start):
            start.wait()
            try:
                store.save(make_voice(name, seed=seed))
                return seed
            except VoiceExists:
                return None

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(save, range(4)))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1, results
        assert np.array_equal(store.load(name).codes, make_voice(name, seed=winners[0]).codes)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"race{i}.npz" for i in range(5)]


@pytest.mark.parametrize("fault, full", [(errno.ENOSPC, True), (errno.EROFS, False), (errno.EACCES, False)])
def test_storage_faults_are_their_own_error(tmp_path, monkeypatch, fault, full):
    store = VoiceStore(tmp_path)
    store.save(make_voice("alice"))

    def fail(*args, **kwargs):
        raise OSError(fault, os.strerror(fault))

    monkeypatch.setattr(tempfile, "mkstemp", fail)
    with pytest.raises(VoiceStorageError) as caught:
        store.save(make_voice("bob"))
    assert caught.value.full is full
    monkeypatch.setattr(os, "unlink", fail)
    with pytest.raises(VoiceStorageError):
        store.remove("alice")


def test_a_store_whose_folder_cannot_be_locked_still_saves(tmp_path, monkeypatch):
    """NFS emulates flock with POSIX locks, which a folder opened to read cannot take (EBADF): saving goes on
    unlocked, as before the lock, rather than failing."""
    import fcntl

    def refuse(fd, operation):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", refuse)
    store = VoiceStore(tmp_path)
    store.save(make_voice("nfs"))
    assert store.names() == ["nfs"]
