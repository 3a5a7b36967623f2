"""A text's blocks as written (paragraphs, list items on lines of their own) in the split of a long text: each
starts a sentence, and a list's number ends none (characters as tokens, so the limits are easy to read)."""

from __future__ import annotations

import pytest

from audio8_coreai.request import check_request
from audio8_coreai.text import split_text
from audio8_coreai.text.checks import clean_text
from audio8_coreai.text.split import block_starts, with_line_breaks

STEPS = "Here are the steps:\n1. Open the box.\n2. Take out the manual.\n3. Read it twice.\n4. Plug it in."


def test_block_starts_are_where_each_block_begins_in_the_cleaned_text():
    text = "Intro line\n\n  Second paragraph here.\n1. One\n  2) Two\n- dash\n* star\n• dot\nplain\nline"
    cleaned = clean_text(text)
    starts = block_starts(text)
    assert [cleaned[b : b + 4] for b in starts] == ["Seco", "1. O", "2) T", "- da", "* st", "• do"]
    assert block_starts("One line. Another.") == () and block_starts("1. First\n") == ()


@pytest.mark.parametrize(
    "text, limit, pieces",
    [
        (  # the next item's number ended each piece: "... box. 2." | "Take out"
            STEPS,
            30,
            [
                "Here are the steps:",
                "1. Open the box.",
                "2. Take out the manual.",
                "3. Read it twice.",
                "4. Plug it in.",
            ],
        ),
        (
            STEPS,
            60,
            ["Here are the steps: 1. Open the box. 2. Take out the manual.", "3. Read it twice. 4. Plug it in."],
        ),
        (  # items without a period of their own
            "Steps:\n1. Open the box\n2. Take out the manual\n3. Read it twice",
            30,
            ["Steps: 1. Open the box", "2. Take out the manual", "3. Read it twice"],
        ),
        (
            "Buy:\n- milk and eggs\n- a loaf of bread\n- cheese",
            20,
            ["Buy: - milk and eggs", "- a loaf of bread", "- cheese"],
        ),
        ("We had 3. Then we left. It was late.", 14, ["We had 3.", "Then we left.", "It was late."]),  # no block
        ("We sold\n100. Then we left, at last.", 20, ["We sold", "100. Then we left,", "at last."]),
        (  # a zero-width space before each item (copied from a web page) hid the line break before it
            "Steps:\n\u200b1. Open the box\n\u200b2. Take out the manual",
            30,
            ["Steps: 1. Open the box", "2. Take out the manual"],
        ),
    ],
)
def test_a_block_starts_a_piece_and_its_number_ends_none(text, limit, pieces):
    out = split_text(text, limit, len)
    assert out == pieces
    assert " ".join(out) == clean_text(text)  # nothing dropped or moved


def test_a_requests_pieces_start_at_its_list_items(tiny_tts):
    """Through the plan (say, synthesize, the servers): the checked request carries where its blocks began."""
    items = "".join(f"\n{n}. Read item {n} aloud." for n in range(1, 9))
    checked = check_request("Here is the list:" + items)
    assert checked.breaks == block_starts("Here is the list:" + items) and len(checked.breaks) == 8
    pieces = [p.text for p in tiny_tts.plan(checked).pieces]
    assert len(pieces) == 5 and all(p.endswith("aloud.") for p in pieces), pieces  # was "... aloud. 2."
    assert [p.split(".")[0] for p in pieces] == ["Here is the list: 1", "2", "4", "6", "8"]


def test_pieces_spoken_as_texts_of_their_own_keep_their_list_items():
    """Wyoming speaks a text over its character cap in parts, each checked and split again as a request of its own:
    the parts were cleaned pieces, so inside one a list's number ended a piece again."""
    from audio8_coreai.server.wyoming import _parts

    text = "Intro here.\n\nSteps:\n1. Open the box now.\n2. Take out the manual.\n3. Read it.\n- a bullet\n4. Done."
    breaks = block_starts(text)
    pieces = split_text(text, 40, len)
    kept = with_line_breaks(pieces, breaks)
    assert [len(k) for k in kept] == [len(p) for p in pieces] and " ".join(kept).split() == clean_text(text).split()
    assert kept == [
        "Intro here.\nSteps:\n1. Open the box now.",
        "2. Take out the manual.\n3. Read it.",
        "- a bullet\n4. Done.",
    ]
    assert _parts(text, 40) == kept
    assert [check_request(part).breaks for part in kept] == [(19,), (24,), (11,)]  # each part's own item
