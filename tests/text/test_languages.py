"""Text outside the model's languages (English, Japanese, Mandarin Chinese) is spoken with a warning: one line on
the CLI's stderr, an UnsupportedLanguageWarning in the API, an X-Audio8-Warning header from the server."""

from __future__ import annotations

import warnings

import pytest
from typer.testing import CliRunner

from audio8_coreai import UnsupportedLanguageWarning
from audio8_coreai.cli import app
from audio8_coreai.text import LANGUAGES, language_warning

SPOKEN = {
    "en": "The meeting has been moved to Thursday afternoon, so please update your calendars.",
    "ja": "明日の午後、駅前の喫茶店で待ち合わせましょう。",
    "zh": "请在下周三之前把报告发给我，谢谢。",
    "zh traditional": "今天下午的會議改到三點半開始。",
    "accents and symbols": "Café naïve façade — 42 € 🙂 ½ №5 ™",
    "kana marks": "ラーメン、ゝゞヽヾ々〆",
    "ko": "안녕하세요, 반갑습니다.",
    "de": "Die Straße ist schön.",
    "lone letters as symbols": "The resistor is 10 kΩ, π is 3.14 and the grain 5 μm wide.",
}
FOREIGN = {
    "ru": ("Привет, как дела?", "Cyrillic"),
    "el": ("Καλημέρα σας.", "Greek"),
    "ar": ("مرحبا بالعالم", "Arabic"),
    "hi": ("नमस्ते दुनिया", "Devanagari"),
    "mixed": ("Hello Привет Καλημέρα", "Cyrillic, Greek"),
    "yue": ("佢哋今日唔嚟食飯喇。", "Cantonese"),
    # scripts of several words are named whole (the name's first word said "New" and "Old" letters)
    "khb": ("ᦀᦁᦂ", "New Tai Lue letters"),
    "ett": ("𐌀𐌁", "Old Italic letters"),
    "sat": ("ᱚᱛ", "Ol Chiki letters"),
    "iu": ("ᐊᐃ", "Canadian Syllabics letters"),
    "th": ("สวัสดี", "Thai letters"),
    # words of one letter, or letters joined by marks, a joiner or the tatweel
    "ru short": ("А я?", "Cyrillic"),
    "hi short": ("हाँ।", "Devanagari"),
    "ar tatweel": ("بـك", "Arabic"),
    "fa joiner": ("ب\u200cپ", "Arabic"),
}


def test_the_languages_are_the_gates():
    assert list(LANGUAGES) == ["en", "zh", "ja", "ko", "de", "fr", "es"]


@pytest.mark.parametrize("case", list(SPOKEN))
def test_text_in_the_models_languages_gets_no_warning(case):
    assert language_warning(SPOKEN[case]) is None


@pytest.mark.parametrize("case", list(FOREIGN))
def test_text_in_another_script_is_named(case):
    text, named = FOREIGN[case]
    note = language_warning(text)
    assert note is not None and named in note, note
    # what this port measured, not a claim about the model's languages (the publisher's list may hold more)
    assert "measured the model in English, Mandarin Chinese, Japanese, Korean, German, French and Spanish only" in note
    assert note.isascii() and "\n" not in note  # fit for an HTTP header: no character of the text in it


def test_the_api_warns_with_a_named_category(tiny_tts):
    with pytest.warns(UnsupportedLanguageWarning, match="Cyrillic"):
        tiny_tts.generate("Привет, как дела?", seed=1, max_frames=2)
    with pytest.warns(UnsupportedLanguageWarning, match="Cantonese"):
        tiny_tts.stream("佢哋今日唔嚟。", seed=1, max_frames=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsupportedLanguageWarning)
        tiny_tts.generate(SPOKEN["ja"], seed=1, max_frames=2)  # none for the model's languages


def test_say_warns_once_on_stderr(tiny_checkpoint, tmp_path):
    args = ["--model", str(tiny_checkpoint), "--device", "cpu", "--seed", "1", "--max-frames", "2"]
    result = CliRunner().invoke(app, ["say", "Привет, как дела?", "-o", str(tmp_path / "ru.wav"), *args])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert said.count("warning: the text has Cyrillic letters") == 1, result.output
    assert "UnsupportedLanguageWarning" not in result.output  # the CLI's line, not Python's too
    result = CliRunner().invoke(app, ["say", "Hello there.", "-o", str(tmp_path / "en.wav"), *args])
    assert result.exit_code == 0 and "letters" not in result.output and "Cantonese" not in result.output


def test_the_server_says_it_in_a_header(tiny_tts):
    from fastapi.testclient import TestClient

    from audio8_coreai.server.app import create_app

    with TestClient(create_app([tiny_tts])) as client:
        body = {"model": "audio8", "seed": 1, "max_frames": 2, "response_format": "wav"}
        ru = client.post("/v1/audio/speech", json={**body, "input": "Привет, как дела?"})
        assert ru.status_code == 200, ru.text
        assert "Cyrillic" in ru.headers["X-Audio8-Warning"]
        en = client.post("/v1/audio/speech", json={**body, "input": "Hello there."})
        assert en.status_code == 200 and "X-Audio8-Warning" not in en.headers
