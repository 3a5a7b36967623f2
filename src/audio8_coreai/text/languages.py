"""The languages the publisher's model speaks, and the one check that warns for text written in another script."""

from __future__ import annotations

import unicodedata

import regex

# The languages this port measures the model in, ISO 639-1 code -> name: those of the quality gate's fixtures
# (measure/gate, from PORT-NOTES.md: the publisher's evaluation speaks en, ja, zh), listed by Wyoming too. Other
# languages in these scripts are not told apart, except written Cantonese by the characters below.
LANGUAGES = {
    "en": "English",
    "zh": "Mandarin Chinese",
    "ja": "Japanese",
    "ko": "Korean",
    "de": "German",
    "fr": "French",
    "es": "Spanish",
}
# A letter outside the scripts of those languages (Latin, Han, the kana, Hangul; Common and Inherited marks are
# shared); two or more in a row (marks, joiners and the Arabic tatweel between them) are a word of another script,
# where one alone among letters of these is a symbol ("10 kΩ", "π", "5 μm").
_FOREIGN = r"[\p{L}--[\p{Latin}\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\p{Common}\p{Inherited}]]"
_FOREIGN_LETTER = regex.compile(_FOREIGN, regex.V1)
_FOREIGN_WORD = regex.compile(rf"(?:{_FOREIGN}[\p{{M}}\p{{Cf}}\u0640]*){{2,}}", regex.V1)
_SPOKEN_LETTER = regex.compile(r"[\p{Latin}\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]")
# Characters of written Cantonese that standard written Chinese does not use (its particles and pronouns).
_CANTONESE = frozenset("嘅咗唔佢冇喺啲嚟嘢哋嗰噉咩啱嘞囉睇咁")


def language_warning(text: str) -> str | None:
    """One ASCII line warning that ``text`` is not in the model's languages (:data:`LANGUAGES`), or None.

    Warns for words of any other script (Cyrillic, Greek, Arabic, Thai...: not measured here, so possibly spoken as
    noise or skipped; a lone letter such as "Ω" or "π" among letters of these languages is taken as a symbol) and for
    characters of written Cantonese (read as Mandarin, if at all). Latin-script text is not checked further: French
    or German is read as best the model can. The line names no character of the text (it may go into an HTTP
    header)."""
    foreign = [c for word in _FOREIGN_WORD.findall(text) for c in word if _FOREIGN_LETTER.match(c)]
    if not foreign and not _SPOKEN_LETTER.search(text):  # only lone letters, none of these languages': "Я."
        foreign = _FOREIGN_LETTER.findall(text)
    names = list(LANGUAGES.values())
    languages = f"this port has measured the model in {', '.join(names[:-1])} and {names[-1]} only"
    if foreign:
        scripts = sorted({_script(c) for c in foreign})
        shown = ", ".join(scripts[:3]) + (f" and {len(scripts) - 3} more" if len(scripts) > 3 else "")
        return f"the text has {shown} letters; {languages}, so these may be spoken as noise or not at all"
    if _CANTONESE.intersection(text):
        return f"the text looks like written Cantonese; {languages}, so it may be misread or not spoken at all"
    return None


# The words of a letter's Unicode name that follow its script's name ("NEW TAI LUE LETTER HIGH QA", "GREEK SMALL
# LETTER ALPHA", "CANADIAN SYLLABICS A", "THAI CHARACTER KO KAI").
_AFTER_SCRIPT = frozenset({"LETTER", "SMALL", "CAPITAL", "SYLLABLE", "SYLLABICS", "CHARACTER", "LIGATURE", "VOWEL"})


def _script(char: str) -> str:
    """The script a letter is written in, from its Unicode name: ``New Tai Lue``, ``Cyrillic`` (not the name's
    first word, which said "New" and "Old" letters)."""
    words = unicodedata.name(char, "OTHER").split(" ")
    end = next((i for i, word in enumerate(words) if word in _AFTER_SCRIPT and i > 0), 1)
    return " ".join(words[: end + (words[end : end + 1] == ["SYLLABICS"])]).title()  # "Canadian Syllabics"
