"""The gate's fixtures: utterances (text, language, seed, optional reference clip) read from a JSON file, and
reference clips spoken by espeak-ng for clone fixtures that give only a transcript."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ...text import check_text
from .errors import GateError

DEFAULT_FIXTURES = Path(__file__).with_name("gate_fixtures.json")
ESPEAK_VOICES = {"en": "en-us", "ja": "ja", "zh": "cmn", "de": "de", "fr": "fr", "es": "es", "ko": "ko"}


@dataclass(frozen=True)
class Fixture:
    """One utterance of the gate: ``text`` in ``language`` (ISO 639-1) with ``seed``; a clone fixture also has
    the reference clip ``ref_audio`` (a path, or None to speak ``ref_text`` with espeak-ng voice
    ``espeak_voice``) and its transcript ``ref_text``."""

    name: str
    language: str
    text: str
    seed: int
    ref_text: str | None = None
    ref_audio: Path | None = None
    espeak_voice: str | None = None

    @property
    def clone(self) -> bool:
        return self.ref_text is not None


def load_fixtures(path: str | Path | None = None) -> list[Fixture]:
    """Read a fixtures file (default: the set shipped with the package) -> fixtures, in file order.

    The file is a JSON list of ``{"name", "language", "text", "seed", "reference"}`` where ``reference`` is
    null (the model's own voice) or ``{"text": transcript, "audio": clip path or null, "espeak_voice":
    optional}``; a relative clip path is relative to the file. Raises GateError naming the entry and field.
    """
    path = Path(path).expanduser() if path is not None else DEFAULT_FIXTURES
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GateError(f"cannot read fixtures {path}: {e}") from e
    if not isinstance(entries, list) or not entries:
        raise GateError(f"fixtures {path}: expected a non-empty JSON list of fixtures")
    out, names = [], set()
    for i, e in enumerate(entries):
        where = f"fixtures {path}, entry {i}"
        if not isinstance(e, dict):
            raise GateError(f"{where}: expected an object with name, language, text, seed, reference")
        missing = [k for k in ("name", "language", "text", "seed") if k not in e]
        if missing:
            raise GateError(f"{where}: missing {', '.join(missing)}")
        name, language, text, seed = e["name"], e["language"], e["text"], e["seed"]
        if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
            raise GateError(f"{where}: name must be letters, digits, '_' or '-' (it names files), got {name!r}")
        if name in names:
            raise GateError(f"{where}: the name {name!r} is used twice")
        names.add(name)
        if not isinstance(language, str) or not language:
            raise GateError(f"{where} ({name}): language must be a code such as en, ja, zh")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise GateError(f"{where} ({name}): seed must be an integer >= 0, got {seed!r}")
        ref = e.get("reference")
        if ref is None:
            out.append(Fixture(name, language, check_text(text), seed))
            continue
        if not isinstance(ref, dict) or not isinstance(ref.get("text"), str):
            raise GateError(
                f'{where} ({name}): reference must be null or {{"text": transcript, "audio": '
                'clip path or null, "espeak_voice": optional}'
            )
        audio = ref.get("audio")
        clip = None if audio is None else (path.parent / Path(audio).expanduser())
        out.append(
            Fixture(
                name,
                language,
                check_text(text),
                seed,
                check_text(ref["text"], "reference text"),
                clip,
                ref.get("espeak_voice"),
            )
        )
    return out


def espeak_clip(text: str, voice: str, path: Path) -> Path:
    """Speak ``text`` with espeak-ng ``voice`` into the WAV ``path`` (22.05 kHz, 16-bit mono).

    Raises GateError when espeak-ng is not installed or fails (unknown voice)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise GateError(
            "espeak-ng is not installed, and a clone fixture without a clip needs it to speak its "
            "reference (apt-get install espeak-ng), or give the clip in the fixtures file"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    run = subprocess.run([exe, "-v", voice, "-w", str(path), text], capture_output=True, text=True, timeout=120)
    if run.returncode != 0 or not path.is_file():
        raise GateError(f"espeak-ng could not speak voice {voice!r}: {run.stderr.strip() or run.returncode}")
    return path
