"""The words after which a period ends no sentence, or only sometimes (:mod:`.split`'s sentence ends)."""

from __future__ import annotations

# Words whose period never ends a sentence in the Latin-script languages the model speaks (en, de, fr, es):
# titles before a name and abbreviations that stand inside a sentence; lowercased, without the final period.
# A missed sentence end costs little (the text is cut at the next one, or at a clause), a false one puts a
# pause after "Dr.", so the lists lean towards keeping a sentence whole.
ABBREVIATIONS_INSIDE = frozenset(
    {
        # en
        "mr",
        "mrs",
        "ms",
        "mx",
        "dr",
        "prof",
        "rev",
        "hon",
        "st",
        "mt",
        "gen",
        "col",
        "capt",
        "lt",
        "sgt",
        "gov",
        "sen",
        "rep",
        "fr",
        "sr",
        "jr",
        "vs",
        "cf",
        "viz",
        "e.g",
        "i.e",
        # de: Herr, Fräulein, zum Beispiel, das heißt, unter anderem, beziehungsweise, vergleiche...
        "hr",
        "frl",
        "z.b",
        "d.h",
        "u.a",
        "bzw",
        "vgl",
        "ggf",
        "evtl",
        "sog",
        "inkl",
        "zzgl",
        # fr: Madame, Mademoiselle, Monseigneur, Professeur, par exemple, c'est-à-dire
        "mme",
        "mlle",
        "mgr",
        "pr",
        "p.ex",
        "c.-à-d",
        "av",  # avenue: before a name
        # es: Señora, Señorita, Doctora, usted, ustedes, doña, por ejemplo
        "sra",
        "srta",
        "dra",
        "ud",
        "uds",
        "vd",
        "dña",
        "p.ej",
    }
)
# Abbreviations that also close sentences ("... and so on, etc. The next"): a sentence end only when the
# next word does not start with a lowercase letter or a digit ("etc. and", "No. 5", "ca. 30" continue).
ABBREVIATIONS_EITHER = frozenset(
    {
        "etc",
        "approx",
        "fig",
        "no",
        "nos",
        "vol",
        "ch",
        "p",
        "pp",
        "inc",
        "ltd",
        "co",
        "corp",
        "ave",
        "blvd",  # en
        "ca",
        "nr",
        "usw",
        "str",
        "abs",  # de
        "env",
        "bd",
        "janv",
        "févr",
        "avr",
        "juil",
        "sept",
        "oct",
        "nov",
        "déc",  # fr (months before a date: "janv. 2020")
        "cap",  # es (capítulo)
        "aprox",
        "pág",
        "núm",
        "tel",  # es
    }
)
# German ordinals before a month ("am 3. Oktober"): a number's period is no sentence end before these.
MONTHS_DE = frozenset(
    {
        "januar",
        "februar",
        "märz",
        "april",
        "mai",
        "juni",
        "juli",
        "august",
        "september",
        "oktober",
        "november",
        "dezember",
    }
)
