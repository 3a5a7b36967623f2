"""Prompt assembly against the publisher's recordings (oracle/prompts.json and the tiny fixture)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from audio8_coreai.config import ModelConfig
from audio8_coreai.errors import PromptError
from audio8_coreai.text import (
    PromptBuilder,
    build_qwen_tokenizer,
    build_tiny_tokenizer,
    check_text,
    clean_text,
    split_text,
)
from tests.oracle_files import ORACLE

# Read at import time for the parametrisation.
PROMPTS = json.loads((ORACLE / "prompts.json").read_text(encoding="utf-8"))["prompts"]

# Audio8-TTS-Preview-0.6b's config.json (SPEC.md section 1).
REAL_CONFIG = {
    "model_type": "arktts",
    "vocab_size": 155776,
    "dim": 896,
    "n_layer": 24,
    "n_head": 14,
    "n_local_heads": 2,
    "head_dim": 64,
    "intermediate_size": 4864,
    "max_seq_len": 2048,
    "rope_base": 1000000.0,
    "norm_eps": 1e-6,
    "codebook_size": 4096,
    "num_codebooks": 10,
    "semantic_begin_id": 151678,
    "semantic_end_id": 155773,
    "n_fast_layer": 4,
    "fast_dim": 896,
    "fast_n_head": 14,
    "fast_n_local_heads": 2,
    "fast_head_dim": 64,
    "fast_intermediate_size": 4864,
    "eos_token_id": 151645,
    "pad_token_id": 151643,
}


@pytest.fixture(scope="module")
def real_config() -> ModelConfig:
    return ModelConfig.from_dict(REAL_CONFIG)


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    return build_qwen_tokenizer()  # about 2 s


@pytest.fixture(scope="module")
def builder(qwen: Tokenizer, real_config: ModelConfig) -> PromptBuilder:
    return PromptBuilder(qwen, real_config)


@pytest.fixture(scope="module")
def tiny_config() -> ModelConfig:
    return ModelConfig.from_dict(json.loads((ORACLE / "tiny" / "config.json").read_text(encoding="utf-8")))


@pytest.mark.parametrize("entry", PROMPTS, ids=[p["name"] for p in PROMPTS])
def test_oracle_prompts(builder: PromptBuilder, entry: dict) -> None:
    if entry["reference_text"] is None:
        prompt = builder.plain(entry["text"])
        assert prompt[0].tolist() == entry["prompt_row0"]
        assert entry["rows_1_10_all_zero"] and not prompt[1:].any()
    else:
        prompt = builder.clone(entry["text"], entry["reference_text"], np.array(entry["reference_codes"]))
        assert prompt.tolist() == entry["prompt"]
    assert prompt.dtype == np.int64 and prompt.shape[0] == 11


def test_spec_example_lengths(builder: PromptBuilder) -> None:
    # SPEC.md section 5: 31 prefix + 50 reference + 15 suffix columns; plain prompt 24.
    codes = np.arange(500).reshape(10, 50) % 4096
    prompt = builder.clone("Hello, world!", "This is a test.", codes)
    assert prompt.shape == (11, 96)
    assert (prompt[0, 31:81] == codes[0] + 151678).all()
    assert (prompt[1:, 31:81] == codes).all()
    assert not prompt[1:, :31].any() and not prompt[1:, 81:].any()
    assert builder.plain("Hello, world!").shape == (11, 24)


def fold_to_tiny(row0: np.ndarray, real: ModelConfig, tiny: ModelConfig) -> np.ndarray:
    """How the oracle recorded tiny prompts from real Qwen ids (worked out from the fixture).

    Specials map to pad 0 / 1 / eos 2 / 299, semantic ids shift to the tiny range, and any other text id
    ``t`` becomes ``3 + t % 290`` (so text stays in 3..292, below the tiny semantic ids).
    """
    out = 3 + row0 % 290
    semantic = row0 >= real.semantic_begin_id
    out[semantic] = row0[semantic] - real.semantic_begin_id + tiny.semantic_begin_id
    for real_id, tiny_id in {151643: 0, 151644: 1, 151645: 2, 151673: 299}.items():
        out[row0 == real_id] = tiny_id
    return out


def test_tiny_fixture_plain(builder, real_config, tiny_config, fixture) -> None:
    prompt = builder.plain("Hello, world!")
    for scenario in ("plain", "greedy"):
        recorded = fixture[f"{scenario}__prompt_input_ids"][0]
        assert (fold_to_tiny(prompt[0], real_config, tiny_config) == recorded[0]).all()
        assert not recorded[1:].any()


def test_tiny_fixture_clone(builder, real_config, tiny_config, fixture) -> None:
    codes = fixture["clone__ref_codes"][0, :, : int(fixture["clone__ref_code_lengths"][0])]
    prompt = builder.clone("Hello, world!", "This is a test.", codes)
    recorded = fixture["clone__prompt_input_ids"][0]
    assert (fold_to_tiny(prompt[0], real_config, tiny_config) == recorded[0]).all()
    assert (prompt[1:] == recorded[1:]).all()


def test_tiny_fixture_batch(builder, real_config, tiny_config, fixture) -> None:
    # The batch scenario left-pads the shorter prompt: pad id in row 0, zeros below (SPEC.md section 5).
    recorded = fixture["batch__prompt_input_ids"]
    width = recorded.shape[2]
    for item, text in enumerate(["Hello, world!", "The quick brown fox jumps over the lazy dog."]):
        prompt = builder.plain(text)
        pad = width - prompt.shape[1]
        assert (recorded[item, 0, :pad] == tiny_config.pad_token_id).all()
        assert (fold_to_tiny(prompt[0], real_config, tiny_config) == recorded[item, 0, pad:]).all()
        assert not recorded[item, 1:].any()


def test_tiny_tokenizer_prompt(tiny_config: ModelConfig) -> None:
    builder = PromptBuilder(build_tiny_tokenizer(), tiny_config)
    plain = builder.plain("Hi there.")
    assert plain[0, 0] == 1 and plain[0, -1] == 259 and plain[0].max() < tiny_config.semantic_begin_id
    codes = np.full((10, 4), 7)
    clone = builder.clone("Hi there.", "Reference words.", codes)
    assert (clone[0] >= 300).sum() == 4 and (clone[1:] == 7).sum() == 40


def test_speaker_tag(builder: PromptBuilder) -> None:
    codes = np.zeros((10, 2), dtype=np.int32)
    tagged = builder.clone("Hello.", "Hi <|speaker:12|> there", codes)
    untagged = builder.clone("Hello.", "Hi there", codes)
    start = len(
        builder.encode("<|im_start|>system\nconvert the provided text to speech reference to the following:\n\nText:\n")
    )
    kept = builder.encode("Hi <|speaker:12|> there")
    assert tagged[0, start : start + len(kept)].tolist() == kept
    added = builder.encode("<|speaker:0|>Hi there")
    assert untagged[0, start : start + len(added)].tolist() == added


def test_specials_in_text_are_specials(builder: PromptBuilder) -> None:
    # The publisher passes allowed_special="all": a literal special string in user text is that special.
    row0 = builder.plain("one<|im_end|>two")[0].tolist()
    assert row0.count(151645) == 3


def test_clean_text() -> None:
    assert clean_text("  a\n\n b\tc\u3000d\xa0e\u2028f  ") == "a b c d e f"
    assert clean_text("你好\n世界") == "你好 世界"
    assert check_text(" 3 ") == "3"


@pytest.mark.parametrize(
    ("text", "cleaned"),
    [
        ("a\x00b\x07c\x7fd", "abcd"),  # NUL, BEL, DEL
        ("\x1b[31mred\x1b[0m", "[31mred[0m"),  # a terminal's colour codes lose their ESC
        ("zero\u200bwidth\u00adsoft\ufeffmark", "zerowidthsoftmark"),  # format characters (Cf)
        ("\ue000private\U000e0001 tag", "private tag"),  # private use, a tag character
        ("汉字\U00031350字 \U0002ebf0", "汉字\U00031350字 \U0002ebf0"),  # CJK ext. H, I: unassigned (Cn) in 3.11, kept
        ("a\x1cb\x85c", "a b c"),  # controls that are whitespace fold as whitespace
    ],
)
def test_clean_text_drops_category_c(builder: PromptBuilder, text: str, cleaned: str) -> None:
    # The publisher's ONNX, Candle and JS runtimes' rule (SPEC.md section 11): its HF processor tokenized them.
    assert clean_text(text) == cleaned
    assert builder.plain(text).tolist() == builder.plain(cleaned).tolist()


def test_text_of_control_characters_is_empty(builder: PromptBuilder) -> None:
    with pytest.raises(PromptError, match=r"empty \(or only whitespace and control characters\)"):
        builder.plain("\x00\x1b\u200b")


@pytest.mark.parametrize("text", ["", "   \n\t\u3000", "...!!", "—", "👍🎉", "?!"])
def test_unspeakable_text(builder: PromptBuilder, text: str) -> None:
    with pytest.raises(PromptError, match="empty|no letters or digits"):
        builder.plain(text)
    with pytest.raises(PromptError, match="empty|no letters or digits"):
        builder.clone(text, "reference", np.zeros((10, 1), dtype=np.int64))


def test_too_long(tiny_config: ModelConfig) -> None:
    builder = PromptBuilder(build_tiny_tokenizer(), tiny_config)
    with pytest.raises(PromptError, match=r"prompt is \d+ tokens \(text of \d+ tokens\) .*\(max_seq_len\) is 512"):
        builder.plain("word " * 200)
    with pytest.raises(PromptError, match=r"reference of 500 frames"):
        builder.clone("Hello.", "Hi.", np.zeros((10, 500), dtype=np.int64))
    builder.check_fits(500, 12)
    with pytest.raises(PromptError, match=r"prompt is 500 tokens; with max_new_frames 13 .* at most 12 frames"):
        builder.check_fits(500, 13)


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        (np.zeros((9, 3), dtype=np.int64), r"shape \[10, frames\], got \[9, 3\]"),
        (np.zeros(30, dtype=np.int64), r"shape \[10, frames\]"),
        (np.zeros((10, 0), dtype=np.int64), "no frames"),
        (np.zeros((10, 3), dtype=np.float32), "must be integers"),
        (np.full((10, 3), 4096), r"code 4096 at codebook 0, frame 0 is outside \[0, 4096\)"),
        (np.pad(np.full((1, 1), -1), ((9, 0), (2, 0))), r"code -1 at codebook 9, frame 2"),
    ],
)
def test_bad_reference_codes(builder: PromptBuilder, codes: np.ndarray, message: str) -> None:
    with pytest.raises(PromptError, match=message):
        builder.clone("Hello.", "Hi.", codes)


def test_empty_reference_text(builder: PromptBuilder) -> None:
    with pytest.raises(PromptError, match="reference text is empty"):
        builder.clone("Hello.", " \n ", np.zeros((10, 2), dtype=np.int64))


def test_tokenizer_checkpoint_mismatch(qwen: Tokenizer, tiny_config: ModelConfig) -> None:
    with pytest.raises(PromptError, match="outside the model's vocab_size 560"):
        PromptBuilder(qwen, tiny_config)
    with pytest.raises(PromptError, match="has no <\\|voice\\|> token"):
        PromptBuilder(Tokenizer.from_str(build_tiny_tokenizer().to_str().replace("<|voice|>", "<|x|>")), tiny_config)


def test_eos_mismatch(real_config: ModelConfig, qwen: Tokenizer) -> None:
    config = ModelConfig.from_dict({**REAL_CONFIG, "eos_token_id": 151643})
    with pytest.raises(PromptError, match="eos_token_id 151643 is not the tokenizer's <\\|im_end\\|> id 151645"):
        PromptBuilder(qwen, config)


def test_every_oracle_entry_collected() -> None:
    # Guards the parametrisation above against a moved or truncated prompts.json.
    assert len(PROMPTS) == 19


# ------------------------------------------------------------------------------------------------------------
# Sentence ends in split_text (characters as tokens; each limit is chosen so that a period taken for a
# sentence end would make a piece end there, e.g. "It is late. Dr." then "Smith came.")


@pytest.mark.parametrize(
    "text, limit, pieces",
    [
        # titles, Latin abbreviations and initials keep their sentence (en)
        ("It is late. Dr. Smith came.", 17, ["It is late.", "Dr. Smith came."]),
        ("We waited. Mr. and Mrs. Jones came.", 26, ["We waited.", "Mr. and Mrs. Jones came."]),
        ("Bring fruit. E.g. apples or pears.", 22, ["Bring fruit.", "E.g. apples or pears."]),
        ("Sit. Eat fruit, e.g. apples.", 24, ["Sit.", "Eat fruit, e.g. apples."]),
        ("He read it. J. K. Rowling wrote it.", 24, ["He read it.", "J. K. Rowling wrote it."]),
        # an abbreviation that may also close a sentence does so only before a capital
        ("Take the bus. No. 5 stops here.", 18, ["Take the bus.", "No. 5 stops here."]),
        ("We sold nuts, etc. and went home.", 20, ["We sold nuts,", "etc. and went home."]),
        ("We sold nuts, etc. The end came.", 20, ["We sold nuts, etc.", "The end came."]),
        ("Yes. We met in the U.S. and in Spain.", 33, ["Yes.", "We met in the U.S. and in Spain."]),
        # "I" is a word, not an initial; an ellipsis goes on before a lowercase word only
        ("So did I. Then we left.", 14, ["So did I.", "Then we left."]),
        ("It is. Well... maybe not.", 20, ["It is.", "Well... maybe not."]),
        ("No. Okay... Let us go.", 15, ["No. Okay...", "Let us go."]),
        # decimals and thousands, point or comma, stay whole
        (
            "It was 3.5 degrees. Then 1,000.50 or 1.000,50 or 3,5 came.",
            20,
            ["It was 3.5 degrees.", "Then 1,000.50 or", "1.000,50 or", "3,5 came."],
        ),
        # de: Herr, zum Beispiel, an ordinal before a month; "ca." before a number; a number's own sentence end
        ("Es ist spät. Hr. Müller kommt.", 18, ["Es ist spät.", "Hr. Müller kommt."]),
        ("Es ist spät. Am 3. Oktober kommt er.", 24, ["Es ist spät.", "Am 3. Oktober kommt er."]),
        ("Ja. Obst, z.B. Äpfel.", 18, ["Ja.", "Obst, z.B. Äpfel."]),
        ("Obst. Er bringt ca. 30 Äpfel.", 24, ["Obst.", "Er bringt ca. 30 Äpfel."]),
        ("Er kommt um 3. Das ist gut.", 16, ["Er kommt um 3.", "Das ist gut."]),
        # de: „…“ closes after the sentence's point; a street's "str." before its number
        ("Er sagte: „Es ist so.“ Am 3. Oktober kam er.", 40, ["Er sagte: „Es ist so.“", "Am 3. Oktober kam er."]),
        ("Ja. Wir sind in der Hauptstr. 5 in Bonn.", 37, ["Ja.", "Wir sind in der Hauptstr. 5 in Bonn."]),
        # zh: an opening quote after the end of a sentence or clause goes with what it opens
        ("他走了很远的路。“再见！”她走了很远。", 10, ["他走了很远的路。", "“再见！”", "她走了很远。"]),
        ("他说：“我们走吧。”", 8, ["他说：", "“我们走吧。”"]),
        # fr: Monsieur, Madame, par exemple
        ("Oui. Au 3 av. Foch et en janv. 2020 aussi.", 40, ["Oui.", "Au 3 av. Foch et en janv. 2020 aussi."]),
        ("J'aime les BD. Mon frère lit des romans.", 32, ["J'aime les BD.", "Mon frère lit des romans."]),
        ("Il est tard. M. Dupont et Mme. Martin arrivent.", 35, ["Il est tard.", "M. Dupont et Mme. Martin arrivent."]),
        ("Oui. Du sport, p.ex. le tennis.", 27, ["Oui.", "Du sport, p.ex. le tennis."]),
        # es: Señor, Señora, aproximadamente
        ("Es tarde. El Sr. García y la Sra. López llegan.", 38, ["Es tarde.", "El Sr. García y la Sra. López llegan."]),
        ("Sí. Trajeron aprox. 20 libros.", 27, ["Sí.", "Trajeron aprox. 20 libros."]),
        ("Sí. Lee el cap. 3 hoy.", 20, ["Sí.", "Lee el cap. 3 hoy."]),
        # the danda and the Arabic question mark and comma (languages the model is not measured in) end alike
        ("नमस्ते दोस्त। आज मौसम बहुत अच्छा है।", 24, ["नमस्ते दोस्त।", "आज मौसम बहुत अच्छा है।"]),
        ("تريد القهوة الآن؟ نعم، من فضلك.", 28, ["تريد القهوة الآن؟", "نعم، من فضلك."]),
        # CJK typed with half-width marks (no spaces): a Latin mark before a CJK character ends a sentence or clause
        (
            "今天天气很好,我们去公园散步吧.你觉得怎么样?好的!",
            16,
            ["今天天气很好,我们去公园散步吧.", "你觉得怎么样?好的!"],
        ),
        # halfwidth and full-width CJK forms; an em dash without spaces
        ("今日はいい天気ですね｡公園に行きましょう｡", 12, ["今日はいい天気ですね｡", "公園に行きましょう｡"]),
        ("天気ですね､公園に行きましょう", 10, ["天気ですね､", "公園に行きましょう"]),
        ("東京．大阪．名古屋．", 6, ["東京．大阪．", "名古屋．"]),
        # a full-width point in a number, and a Latin mark after a Latin word, do not end a CJK sentence
        ("円周率は３．１４です。这是１．５公斤。", 12, ["円周率は３．１４です。", "这是１．５公斤。"]),
        ("会いましょう。e.g.東京とMr.田中さん。", 16, ["会いましょう。", "e.g.東京とMr.田中さん。"]),
        ("It was long—very long—too long.", 12, ["It was long—", "very long—", "too long."]),
        # a French closing guillemet after its space stays with the sentence it closes
        ("« Il est tard. » Il part.", 16, ["« Il est tard. »", "Il part."]),
    ],
)
def test_split_text_sentence_ends(text: str, limit: int, pieces: list[str]) -> None:
    assert split_text(text, limit, len) == pieces


@pytest.mark.parametrize(
    "text, limit, pieces",
    [
        # a sentence too long for one piece is cut into the fewest pieces, as even as its words allow: no
        # one-word tail, and no piece that ends another sentence mid-sentence
        (
            "Yes, fine! He said it will rain in the north of the country.",
            32,
            ["Yes, fine!", "He said it will rain in", "the north of the country."],
        ),
        # a sentence that fits joins the piece before it, a cut sentence's last one too
        ("One two three four five six. Go.", 16, ["One two three", "four five six.", "Go."]),
        ("One two three four five six. Go.", 18, ["One two three", "four five six. Go."]),
        # marks alone ride with a piece whatever their length: never a piece of their own
        ("Hello there. " + "— " * 10 + "!", 12, ["Hello there. — — — — — — — — — — !"]),
        ("Hi. " + ", " * 10 + "and so on.", 8, ["Hi.", ", , , , , , , , , , and", "so on."]),
    ],
)
def test_a_long_sentence_is_cut_evenly_and_alone(text: str, limit: int, pieces: list[str]) -> None:
    assert split_text(text, limit, len) == pieces


def test_prefix_length_ends_at_the_user_turn_opening(builder: PromptBuilder) -> None:
    """Plain: system turn + user opening, 14 columns with the Qwen tokenizer ("Hi" is 21: 14 + 1 + 6); a clone's
    head adds its transcript and reference columns; the text itself never counts."""
    plain = builder.plain("Hi")
    assert plain.shape[1] == 21 and builder.prefix_length(plain) == 14
    assert builder.prefix_length(builder.plain("A much longer sentence than that.")) == 14
    codes = np.arange(30).reshape(10, 3) % 7
    clone = builder.clone("Hi", "Hello there.", codes)
    head = builder.prefix_length(clone)
    assert head == clone.shape[1] - 7  # the text (1) and the assistant opening (6) follow it
    assert np.array_equal(builder.clone("Other words here.", "Hello there.", codes)[:, :head], clone[:, :head])
    assert builder.prefix_length(plain[:, :5]) == 0
