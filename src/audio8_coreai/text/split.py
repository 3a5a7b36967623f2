"""Long text split into pieces that each fit one utterance, at sentence ends, then clauses, then spaces."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Collection

from ..errors import PromptError
from .abbreviations import ABBREVIATIONS_EITHER, ABBREVIATIONS_INSIDE, MONTHS_DE
from .checks import check_text, clean_text, drop_invisible

# A Latin mark ends a piece only before a space, the end, or a CJK letter after a CJK letter ("3.14", "３．１４",
# "3,5", "e.g.x", "U.S.A" and "Mr.田中" stay whole; "好的.你" is cut, as CJK text typed with half-width marks has no
# spaces); a CJK mark (full-width and halfwidth forms) or an em dash ends one wherever it is. Closing quotes and
# brackets stay with the mark they follow, a French » after its space too.
SENTENCE_MARKS_LATIN = ".!?…．।؟"  # the full-width stop as a point: "３．１４" is a number; the danda, Arabic "?"
SENTENCE_MARKS_CJK = "。！？｡"
CLAUSE_MARKS_LATIN = ",;:–،؛"  # Arabic comma and semicolon too
CLAUSE_MARKS_CJK = "，、；：､—"
_CLOSERS = "\"'”’»)]}」』）】》"
_CLOSERS_BEFORE_SPACE = "“‘"  # close German „…“ ‚…‘ before a space or the end; open Chinese quotes (。“再见)
_SPACED_CLOSERS = "»›"  # French typesetting: "Bonjour. »"
_SPACED_CLOSE = re.compile(rf"\s+[{_SPACED_CLOSERS}]+(?=\s|$)")

_NEXT_WORD = re.compile(r"\s*(\w*)")
_BLANK = re.compile(r"\s*")  # what may come before a list's number at the text's start ("1. First")
_LONGEST_WORD = 64  # characters looked back for the word before a period (titles and abbreviations are short)
_OPENING = re.compile(r"^\W+")  # opening quotes and brackets before a word


def _continues_sentence(text: str, i: int, j: int, breaks: Collection[int] = ()) -> bool:
    """Whether the marks ``text[i:j]``, followed by a space, leave the sentence open: a period after a title,
    an abbreviation or an initial ("Dr. Smith", "e.g. this", "J. K. Rowling"), a German ordinal before a month
    ("3. Oktober"), a list's number ("1. First": at the text's start or at one of ``breaks``, where a block
    begins: :func:`block_starts`), an ellipsis before a lowercase word ("well... maybe"). Decimals never get here:
    their period is not followed by a space. ``text`` is cleaned (single spaces)."""
    following = _NEXT_WORD.match(text, j).group(1)
    lower_next = following[:1].islower() or following[:1].isdigit()
    run = text[i:j]
    if run in ("...", "…"):
        return following[:1].islower()
    if run != ".":
        return False
    window = max(0, i - _LONGEST_WORD)  # bounded: CJK without spaces stays linear
    begin = max(text.rfind(" ", window, i) + 1, window)
    word = _OPENING.sub("", text[begin:i])  # "(Dr" -> "Dr", "“Mr" -> "Mr"
    key = word.lower()
    if key in ABBREVIATIONS_INSIDE or (len(word) == 1 and word.isupper() and word != "I"):
        return True
    if word.isdigit():  # a list's number ("1. First") begins its text or block; an ordinal ("3. Oktober") goes on
        at_start = _BLANK.fullmatch(text, 0, begin) is not None or begin in breaks
        return lower_next or following.lower() in MONTHS_DE or at_start
    street = len(key) > 3 and key.endswith("str")  # de: "Hauptstr. 5"
    return (key in ABBREVIATIONS_EITHER or street or "." in word) and lower_next  # "U.S. and", "p.m. tomorrow"


def _wide(char: str) -> bool:
    """Whether ``char`` is a wide (CJK) letter, which no space separates from a mark before it."""
    return unicodedata.category(char)[0] == "L" and unicodedata.east_asian_width(char) in "WF"


def _cut(
    text: str, latin: str, cjk: str, continues: Callable[[str, int, int], bool] = lambda text, i, j: False
) -> list[tuple[int, int]]:
    """Spans ``(start, end)`` of ``text`` cut after each run of the given marks (and its closers), except where
    ``continues(text, i, j)`` says the run ``text[i:j]`` does not end one; every character belongs to one span,
    so the spans joined give back ``text``."""
    spans, start, i = [], 0, 0
    marks = latin + cjk
    while i < len(text):
        if text[i] not in marks:
            i += 1
            continue
        j = i + 1
        while j < len(text) and (
            text[j] in marks
            or text[j] in _CLOSERS
            or (text[j] in _CLOSERS_BEFORE_SPACE and (j + 1 == len(text) or text[j + 1].isspace()))
        ):
            j += 1
        spaced = _SPACED_CLOSE.match(text, j)  # at j, not on a copy of the rest: linear in the text
        if spaced:
            j = spaced.end()
        # a CJK letter on both sides: CJK text typed with half-width marks ("e.g.東京", "Mr.田中" go on)
        between = j < len(text) and _wide(text[j]) and i > 0 and _wide(text[i - 1])
        ends = j == len(text) or ((text[j].isspace() or between) and not continues(text, i, j))
        if ends or any(c in cjk for c in text[i:j]):
            spans.append((start, j))
            start = j
        i = j
    if start < len(text):
        spans.append((start, len(text)))
    return spans


def split_text(text: str, max_tokens: int, count: Callable[[str], int]) -> list[str]:
    """Split ``text`` into pieces of at most ``max_tokens`` tokens each (``count(piece)`` tokens), in order.

    Text that fits is returned whole (one piece, cleaned as :func:`check_text`). Otherwise it is cut at
    sentence ends (``. ! ? … ． । ؟`` before a space, or between CJK letters, but not after a title, an abbreviation or
    an initial, see :func:`_continues_sentence`; ``。！？｡`` anywhere), a sentence that is still too long at
    clause marks (``, ; : – ، ؛`` before a space or between CJK letters, ``，、；：､—`` anywhere), and a clause still
    too long at spaces. Whole sentences are joined again while they fit, so pieces are as long as allowed (fewer
    breaks in the prosody); a sentence too long for one piece is cut into the fewest pieces of its own, as even as
    its clauses and words allow (no one-word tail, no piece ending another sentence mid-way). Pieces keep the
    text's own characters: joined with single spaces where the text had
    whitespace, they give back the cleaned text. A cut without a letter or digit ("...", "—") rides with its
    neighbour. Never drops text.

    A block of the text as written (a paragraph after a blank line, a list item after a line break: "2. ",
    "- ") starts a sentence: a piece never ends with the next item's number ("... the box. 2." | "Take out").

    Raises PromptError for unspeakable text (:func:`check_text`) and for a run without any mark or space
    (one long word, or CJK text without punctuation) longer than ``max_tokens``: the message gives the run's
    start and both counts.
    """
    return split_checked(check_text(text, field="text"), max_tokens, count, block_starts(text))


def block_starts(text: str) -> tuple[int, ...]:
    """Where the blocks of ``text`` as written begin in its cleaned form (:func:`..checks.clean_text`), the first
    one's 0 left out: a paragraph after a blank line, a list item after a line break ("1. ", "2) ", "- ", "* ",
    "• "), as a language model's replies are laid out (:data:`_BLOCK_BREAK`)."""
    starts, at = [], 0
    for block in _BLOCK_BREAK.split(drop_invisible(text)):  # a zero-width space before "2. " hid its break
        cleaned = clean_text(block)
        if cleaned:
            if at:
                starts.append(at)
            at += len(cleaned) + 1  # the space the cleaning puts between blocks
    return tuple(starts)


def with_line_breaks(pieces: list[str], breaks: tuple[int, ...]) -> list[str]:
    """``pieces`` of a cleaned text (:func:`split_checked`'s, which joined with single spaces give it back) with a
    line break for the space before each of ``breaks`` inside one: a piece spoken as a text of its own (split again
    for the model's context) still has its list items (:func:`block_starts`); no piece gets longer."""
    out, at, k = [], 0, 0
    for piece in pieces:
        chars, end = list(piece), at + len(piece)
        while k < len(breaks) and breaks[k] < end:
            if breaks[k] > at and chars[breaks[k] - at - 1] == " ":
                chars[breaks[k] - at - 1] = "\n"
            k += 1
        out.append("".join(chars))
        at = end + 1
    return out


def split_checked(text: str, max_tokens: int, count: Callable[[str], int], breaks: tuple[int, ...] = ()) -> list[str]:
    """:func:`split_text` of ``text`` that :func:`check_text` has already cleaned and passed (a checked request's,
    :mod:`...plan`): not checked again; ``breaks``: where its blocks began (:func:`block_starts` of the text as
    written)."""
    if max_tokens < 1:
        raise PromptError(
            f"no room for text: an utterance can hold {max_tokens} tokens of it (a voice whose "
            "reference fills the context?)"
        )
    if count(text) <= max_tokens:
        return [text]
    pieces: list[tuple[int, int]] = []
    lead = None  # where marks before the first words ("... Hello") begin: they ride with the first sentence
    for s0, s1 in _at_breaks(_cut(text, SENTENCE_MARKS_LATIN, SENTENCE_MARKS_CJK, _continuing(breaks)), breaks):
        if not pieces and not _speakable(text[s0:s1]):
            lead = s0 if lead is None else lead
            continue
        s0 = s0 if lead is None else lead
        lead = None
        if not _speakable(text[s0:s1]):  # marks alone ("— — !") ride with the piece before them, whatever their size
            pieces[-1] = (pieces[-1][0], s1)
            continue
        if count(text[s0:s1]) <= max_tokens:  # a whole sentence joins the piece before it while they fit
            if pieces and count(text[pieces[-1][0] : s1].strip()) <= max_tokens:
                pieces[-1] = (pieces[-1][0], s1)
            else:
                pieces.append((s0, s1))
            continue
        # a sentence too long for one piece: pieces of its own (none ends another sentence's mid-sentence), as
        # even as its clauses and words allow
        spans = [
            span
            for c0, c1 in _cut(text[s0:s1], CLAUSE_MARKS_LATIN, CLAUSE_MARKS_CJK)
            for span in _clause_spans(text, s0 + c0, s0 + c1, max_tokens, count)
        ]
        pieces += _balanced(text, spans, max_tokens, count)
    if len(pieces) > 1 and not _speakable(text[slice(*pieces[0])]):
        pieces[:2] = [(pieces[0][0], pieces[1][1])]  # leading marks ride with the first words
    return [text[a:b].strip() for a, b in pieces]


def _continuing(breaks: tuple[int, ...]) -> Callable[[str, int, int], bool]:
    """:func:`_continues_sentence` knowing where the blocks begin."""
    starts = frozenset(breaks)
    return lambda text, i, j: _continues_sentence(text, i, j, starts)


def _at_breaks(spans: list[tuple[int, int]], breaks: tuple[int, ...]) -> list[tuple[int, int]]:
    """``spans`` (in order) cut again at each of ``breaks`` (ascending) inside one (a block begins there: a new
    sentence); one pass over both."""
    out, k = [], 0
    for s0, s1 in spans:
        while k < len(breaks) and breaks[k] < s1:
            if breaks[k] > s0:
                out.append((s0, breaks[k]))
                s0 = breaks[k]
            k += 1
        out.append((s0, s1))
    return out


def _clause_spans(text: str, c0: int, c1: int, max_tokens: int, count: Callable[[str], int]) -> list[tuple[int, int]]:
    """The clause ``text[c0:c1]`` as one span when it fits ``max_tokens``, else its words; raises PromptError for
    a word (a run without a space) that does not fit."""
    if count(text[c0:c1]) <= max_tokens:
        return [(c0, c1)]
    words = []
    for word in re.finditer(r"\S+\s*", text[c0:c1]):
        w0, w1 = c0 + word.start(), c0 + word.end()
        if count(text[w0:w1]) > max_tokens:
            run = text[w0:w1].strip()
            shown = run if len(run) <= 40 else run[:39] + "…"
            raise PromptError(
                f"cannot split the text: {shown!r} ({len(run)} characters, at character {w0}) is "
                f"{count(run)} tokens with nowhere to split (no space, and no sentence or clause mark such "
                f"as . , 。 、 that may end a piece), over the {max_tokens} tokens one utterance can hold; add "
                "punctuation or spaces",
                "text",
            )
        words.append((w0, w1))
    return words


def _balanced(
    text: str, spans: list[tuple[int, int]], max_tokens: int, count: Callable[[str], int]
) -> list[tuple[int, int]]:
    """Consecutive ``spans`` (of one sentence) joined into the fewest pieces of at most ``max_tokens`` tokens, the
    last two as even as the spans allow: filling each piece to the cap in turn leaves a short tail ("... in the" |
    "park."). One pass over the sentence, then one or a few over its last two pieces' spans."""

    def fill(spans: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
        parts: list[tuple[int, int]] = []
        words = False  # whether the last part holds a letter or digit yet: marks alone never end one
        for s0, s1 in spans:
            speakable = _speakable(text[s0:s1])
            if parts and (not speakable or not words or count(text[parts[-1][0] : s1].strip()) <= limit):
                parts[-1] = (parts[-1][0], s1)
            else:
                parts.append((s0, s1))
                words = False
            words = words or speakable
        return parts

    parts = fill(spans, max_tokens)
    if len(parts) < 2:
        return parts
    tail = [span for span in spans if span[0] >= parts[-2][0]]
    limit = -(-count(text[tail[0][0] : tail[-1][1]].strip()) // 2)  # half of the last two pieces' tokens
    while limit < max_tokens:
        even = fill(tail, limit)
        if len(even) <= 2:
            return parts[:-2] + even
        limit += max(1, limit // 8)
    return parts


# Where growing text is cut whatever follows: a blank line (a paragraph), or a line break before a list item
# ("1. ", "2) ", "- ", "* ", "• "), as a language model's replies are laid out.
_BLOCK_BREAK = re.compile(r"\n[^\S\n]*\n\s*|\n[^\S\n]*(?=(?:\d{1,3}[.)]|[-*•])[^\S\n])")  # indent too
_FINAL_CJK = "。！？｡"  # a full-width end never continues (no abbreviations): complete with nothing after it


def complete_sentences(text: str) -> tuple[list[str], str]:
    """The sentences of growing ``text`` (text arriving in parts) that are complete, and the rest to keep.

    A sentence is complete once the next one has begun: its end (as :func:`split_text` finds sentence ends) is
    followed by a word, so a period before a word still to come ("Dr." then " Smith") is not taken for an end.
    A full-width 。！？ ends one at once, and so do a blank line and a line break before a list item ("2. ", "- "):
    a list's number is no sentence end ("1. First" stays whole). Whitespace runs are folded to one space; a span
    without a letter or digit rides with the next sentence (or is dropped before a break).
    Returns ``(sentences, rest)``: the sentences stripped (possibly none), and the text after them, unspoken, as
    it came (its line breaks kept for the next call).
    """
    *blocks, last = _BLOCK_BREAK.split(drop_invisible(text))
    sentences = [s for block in blocks for s in _sentences(re.sub(r"\s+", " ", block), whole=True)[0]]
    raw_at = [m.start() for m in re.finditer(r"\s+|\S", last)] + [len(last)]  # folded index -> index in ``last``
    more, start = _sentences(re.sub(r"\s+", " ", last), whole=False)
    return sentences + more, last[raw_at[start] :]


def _sentences(text: str, whole: bool) -> tuple[list[str], int]:
    """The complete sentences of cleaned ``text`` and where its rest begins: every one when ``whole`` (a break
    follows), else all but the last, and the last but one too while the word after its end has not come."""
    spans = _cut(text, SENTENCE_MARKS_LATIN, SENTENCE_MARKS_CJK, _continues_sentence)
    if whole or text.rstrip().rstrip(_CLOSERS + _CLOSERS_BEFORE_SPACE).endswith(tuple(_FINAL_CJK)):  # "「好。」" too
        keep = 0
    elif len(spans) > 1 and not _speakable(text[slice(*spans[-1])]):
        keep = 2  # the word after the last end has not come yet: that end may still turn out to continue
    else:
        keep = 1
    sentences, start = [], 0
    for _, s1 in spans[: len(spans) - keep]:
        if _speakable(text[start:s1]):
            sentences.append(text[start:s1].strip())
            start = s1
    if whole:
        start = len(text)  # what has no letter or digit before the break is not spoken
    return sentences, start


def _speakable(text: str) -> bool:
    """Whether ``text`` holds a letter or a digit (of any script)."""
    return any(unicodedata.category(c)[0] in "LN" for c in text)
