"""Text checks: the publisher's cleaning and our rule for what can be spoken; the error every text and prompt
check raises."""

from __future__ import annotations

import unicodedata

from ..errors import PromptError


def clean_text(text: str) -> str:
    """The publisher's cleaning: drop every control, format and private-use character that is not whitespace
    (Unicode categories Cc, Cf, Co: NUL, BEL or ESC, zero-width spaces, soft hyphens, a byte-order mark), strip, and
    fold every whitespace run to one space.

    The folding is its HF processor's; the dropping is its ONNX, Candle and JS runtimes' rule (SPEC.md section 11),
    where the HF processor passes such characters to the tokenizer, which reads them as bytes the model then speaks:
    text without them is cleaned exactly as the HF processor does. Those runtimes also drop the code points their
    Unicode table does not know (Cn); we keep them, as which those are depends on the Python version (CJK extension
    H is Cn in 3.11's table): the same text gives the same prompt on every Python. No case folding or number
    expansion, and no deletion of a line break between CJK characters (the other runtimes'): "你好\n世界" becomes
    "你好 世界".
    """
    return " ".join(drop_invisible(text).split())


def drop_invisible(text: str) -> str:
    """``text`` without its control, format and private-use characters that are not whitespace (see
    :func:`clean_text`), its whitespace as it came: where line breaks still matter (:mod:`.split`'s blocks)."""
    if text.isprintable():  # no category-C character and no whitespace but the space: most texts
        return text
    return "".join(c for c in text if c.isspace() or unicodedata.category(c) not in _DROPPED)


_DROPPED = frozenset(("Cc", "Cf", "Co"))  # Cs (a lone surrogate) is refused before: check_unicode


def check_text(text: str, what: str = "text", field: str | None = None) -> str:
    """Clean the text to speak and reject what cannot be spoken; returns the cleaned text. ``what``: the text as
    the messages call it; ``field``: the keyword it came in, the PromptError's (:attr:`.errors.Audio8Error.field`).

    The publisher rejects only an empty text after cleaning. We also reject text without a single letter
    or digit (punctuation, symbols or emoji only, e.g. "...!!" or "—"): the model has nothing to read
    and babbles or stops at once. This stricter rule is ours.
    """
    if not isinstance(text, str):
        raise PromptError(f"{what} must be a string, got {type(text).__name__}", field)
    check_unicode(text, what, field)
    cleaned = clean_text(text)
    if not cleaned:
        words = "what the clip says" if what == "reference text" else "the words to speak"
        raise PromptError(f"{what} is empty (or only whitespace and control characters): give {words}", field)
    if not any(unicodedata.category(c)[0] in "LN" for c in cleaned):
        shown = cleaned if len(cleaned) <= 60 else f"{cleaned[:60]}... ({len(cleaned)} characters)"
        raise PromptError(
            f"{what} {shown!r} has no letters or digits (only punctuation or symbols): "
            "there is nothing to speak; give at least one word",
            field,
        )
    return cleaned


def check_unicode(text: str, what: str = "text", field: str | None = None) -> str:
    """``text`` if it can be written as UTF-8, else PromptError naming the first lone surrogate (U+D800 to U+DFFF:
    half of a UTF-16 pair, e.g. from a JSON escape ``\\ud800``), which no tokenizer, file or HTTP answer takes; one
    of U+DC80 to U+DCFF is a byte that was no UTF-8 (Python's escape for a command line's text in Latin-1, say);
    two such bytes FF FE or FE FF first are UTF-16's byte-order mark (a UTF-16 file read as UTF-8)."""
    bad = next((c for c in text if "\ud800" <= c <= "\udfff"), None)
    if text.startswith(("\udcff\udcfe", "\udcfe\udcff")):  # the bytes FF FE / FE FF: UTF-16's byte-order mark
        raise PromptError(
            f"{what} is UTF-16 (it begins with UTF-16's byte-order mark, as Windows' 'Unicode' files do), not UTF-8: "
            "convert it first: iconv -f utf-16 -t utf-8",
            field,
        )
    if bad is not None and "\udc80" <= bad <= "\udcff":  # a byte no UTF-8 decoder took (a command line's text)
        raise PromptError(
            f"{what} holds U+{ord(bad):04X} at character {text.index(bad)}: the byte 0x{ord(bad) - 0xDC00:02X} "
            "of text that is not UTF-8 (a file or a command line in Latin-1? convert it first: iconv -f latin1 -t "
            "utf-8), or half of a JSON surrogate pair (send it whole)",
            field,
        )
    if bad is not None:
        raise PromptError(
            f"{what} holds a lone surrogate (U+{ord(bad):04X} at character {text.index(bad)}), which is not a "
            "character: send valid UTF-8 text (a pair of surrogates in JSON escapes must be whole)",
            field,
        )
    return text
