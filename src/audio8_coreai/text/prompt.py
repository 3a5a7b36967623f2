"""The [num_codebooks + 1, P] prompt (SPEC.md section 5).

The publisher's ``ArkttsProcessor`` + ``_prepare_prompt`` build a chat-style prompt: a system turn
("convert the provided text to speech", optionally with a reference clip's transcript and codes), a user
turn with the target text, and ``<|im_start|>assistant\\n<|voice|>`` after which frames are generated.
Row 0 holds token ids; rows 1..num_codebooks hold the reference clip's codebooks under its semantic ids and
zero elsewhere. Each template segment is tokenized on its own, so BPE merges never cross segment borders
(joining "test." with "\\n\\nSpeech:\\n" would give a different id for ".\\n\\n").

Ids are taken from the tokenizer and the checkpoint's config, so the same builder serves the real 0.6b
checkpoint and the tiny one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer

from ..config import ModelConfig
from ..errors import PromptError, PromptTooLong
from .checks import check_text, clean_text
from .tokenizer import IM_END, IM_START, VOICE

# Template segments, verbatim from the publisher's processor (SPEC.md section 5).
SYSTEM_OPEN = "<|im_start|>system\n"
PLAIN_INSTRUCTION = "convert the provided text to speech"
CLONE_INSTRUCTION = "convert the provided text to speech reference to the following:\n\nText:\n"
CLONE_SPEECH = "\n\nSpeech:\n"
TURN_END = "<|im_end|>\n"
USER_OPEN = "<|im_start|>user\n"
ASSISTANT_VOICE = "<|im_start|>assistant\n<|voice|>"

# A transcript that names its speaker keeps that tag; otherwise speaker 0 is prepended (SPEC.md section 5).
# ``\d`` as in the publisher's Python regex (Unicode decimal digits).
SPEAKER_TAG = re.compile(r"<\|speaker:\d+\|>")
DEFAULT_SPEAKER = "<|speaker:0|>"


@dataclass(frozen=True)
class PromptHead:
    """The columns every prompt of one voice begins with, int64 ``[num_codebooks + 1, H]`` (the system turn; a
    clone's transcript and reference codes inside it), and ``what`` they hold beside the text, for messages."""

    columns: np.ndarray = field(repr=False)
    what: str = ""


class PromptBuilder:
    """Builds plain and voice-clone prompts for one tokenizer and checkpoint config.

    The special ids are looked up by their strings in the tokenizer, and the config's eos must be
    ``<|im_end|>``'s id: generation stops on it, so a tokenizer/checkpoint mismatch is caught here.
    """

    def __init__(self, tokenizer: Tokenizer, config: ModelConfig):
        self.tokenizer = tokenizer
        self.config = config
        ids = {}
        for token in (IM_START, IM_END, VOICE):
            token_id = tokenizer.token_to_id(token)
            if token_id is None:
                raise PromptError(
                    f"the tokenizer has no {token} token: it is not an Audio8 tokenizer "
                    "(expected the checkpoint's tokenizer.json)"
                )
            if not 0 <= token_id < config.vocab_size:
                raise PromptError(
                    f"{token} is id {token_id}, outside the model's vocab_size "
                    f"{config.vocab_size}: the tokenizer does not belong to this checkpoint"
                )
            ids[token] = token_id
        if config.eos_token_id != ids[IM_END]:
            raise PromptError(
                f"config eos_token_id {config.eos_token_id} is not the tokenizer's {IM_END} id "
                f"{ids[IM_END]}: the tokenizer does not belong to this checkpoint"
            )
        self.voice_id = ids[VOICE]
        # The template segments never change; tokenize them once.
        self._system_open = self.encode(SYSTEM_OPEN)
        self._plain_instruction = self.encode(PLAIN_INSTRUCTION)
        self._clone_instruction = self.encode(CLONE_INSTRUCTION)
        self._clone_speech = self.encode(CLONE_SPEECH)
        self._turn_end = self.encode(TURN_END)
        self._user_open = self.encode(USER_OPEN)
        self._assistant_voice = self.encode(ASSISTANT_VOICE)
        plain = np.zeros((config.num_codebooks + 1, len(self._system_open + self._plain_instruction)), np.int64)
        plain[0] = self._system_open + self._plain_instruction
        plain.setflags(write=False)  # one head shared by every plain prompt
        self._plain_head = PromptHead(plain)

    def encode(self, segment: str) -> list[int]:
        """Token ids of one segment, nothing added around it.

        Special-token strings inside the segment are encoded as the specials, as the publisher's processor
        does (``allowed_special="all"``): a literal ``<|im_end|>`` in user text ends the turn.
        """
        ids = self.tokenizer.encode(segment, add_special_tokens=False).ids
        too_big = [i for i in ids if i >= self.config.vocab_size]
        if too_big:
            raise PromptError(
                f"the tokenizer produced ids {too_big[:5]} >= vocab_size {self.config.vocab_size}: "
                "it does not belong to this checkpoint"
            )
        return ids

    def prefix_length(self, prompt: np.ndarray) -> int:
        """Columns of ``prompt`` (int [1+C, P], built here) before the target text: the system turn (a clone's
        reference and transcript included) and the user turn's opening, up to the first ``<|im_end|>\n
        <|im_start|>user\n`` in row 0; 0 when there is none. Every prompt of one voice starts with the same
        ones, so a backend can keep their KV state (see ``TorchBackend.prefix_length``)."""
        head = np.asarray(self._turn_end + self._user_open)
        row = np.asarray(prompt[0])
        if row.shape[0] < head.shape[0]:
            return 0
        hits = np.flatnonzero((np.lib.stride_tricks.sliding_window_view(row, head.shape[0]) == head).all(axis=1))
        return int(hits[0]) + head.shape[0] if hits.size else 0

    def _suffix(self, target_ids: list[int]) -> list[int]:
        # The user turn and the assistant opening shared by both prompt kinds (SPEC.md section 5, steps 3-7).
        return self._turn_end + self._user_open + target_ids + self._turn_end + self._assistant_voice

    def plain(self, text: str) -> np.ndarray:
        """The plain TTS prompt for ``text``: int64 ``[num_codebooks + 1, P]``, rows 1.. all zero.

        Raises :class:`PromptError` for empty or unspeakable text (:func:`check_text`) or a prompt that
        leaves no room for a frame in ``max_seq_len``.
        """
        return self.build(self.head(), self.encode(check_text(text, field="text")))

    def clone(self, text: str, ref_text: str, ref_codes: np.ndarray) -> np.ndarray:
        """The voice-clone prompt: int64 ``[num_codebooks + 1, P]`` with the reference inside the system turn.

        ``ref_text`` is the reference clip's transcript (cleaned; ``<|speaker:0|>`` prepended unless it has a
        ``<|speaker:N|>`` tag). ``ref_codes`` is the clip's codes, integer ``[num_codebooks, T]``, every value
        in ``[0, codebook_size)`` (the publisher's check, residual rows included). Row 0 holds
        ``semantic_begin_id + ref_codes[0]`` under the T reference columns and rows 1.. hold ``ref_codes``
        there; everything else in rows 1.. is zero.
        """
        target_ids = self.encode(check_text(text, field="text"))
        return self.build(self.head(ref_text, ref_codes), target_ids)

    def head(self, ref_text: str | None = None, ref_codes: np.ndarray | None = None) -> PromptHead:
        """The columns every prompt of one voice begins with: the plain prompt's (no arguments) or, for a clone,
        the system turn holding the transcript ``ref_text`` and the reference ``ref_codes`` (as :meth:`clone`
        says). Built once per voice, so its many pieces' prompts (:meth:`build`) do not redo it. Raises
        PromptError for an empty transcript or codes that are not ``[num_codebooks, T]`` in the codebook's range."""
        if ref_text is None and ref_codes is None:
            return self._plain_head
        if not isinstance(ref_text, str):
            raise PromptError(f"reference text must be a string, got {type(ref_text).__name__}")
        transcript = clean_text(ref_text)
        # The publisher requires a transcript for cloning; an empty one is certainly a mistake.
        if not transcript:
            raise PromptError("reference text is empty: voice cloning needs the transcript of the reference clip")
        if not SPEAKER_TAG.search(transcript):
            transcript = DEFAULT_SPEAKER + transcript
        codes = self._check_codes(ref_codes)
        transcript_ids = self.encode(transcript)
        prefix = self._system_open + self._clone_instruction + transcript_ids + self._clone_speech
        n_ref, start = codes.shape[1], len(prefix)
        columns = np.zeros((self.config.num_codebooks + 1, start + n_ref), dtype=np.int64)
        columns[0, :start] = prefix
        columns[0, start:] = codes[0] + self.config.semantic_begin_id  # [T] semantic ids under the reference
        columns[1:, start:] = codes  # [C, T]
        what = f", a reference transcript of {len(transcript_ids)} tokens and a reference of {n_ref} frames"
        return PromptHead(columns, what)

    def around(self, head: PromptHead) -> int:
        """Columns of a prompt that begins with ``head``, besides its text's tokens."""
        return head.columns.shape[1] + len(self._suffix([]))

    def build(self, head: PromptHead, target_ids: list[int]) -> np.ndarray:
        """The prompt int64 ``[num_codebooks + 1, P]`` of ``head`` then the text of ``target_ids`` (its tokens, as
        :meth:`encode` gives them) and the assistant's opening. Raises :class:`PromptTooLong` for a prompt that
        leaves no room for a frame in ``max_seq_len``."""
        suffix = self._suffix(target_ids)
        width = head.columns.shape[1]
        prompt = np.zeros((self.config.num_codebooks + 1, width + len(suffix)), dtype=np.int64)
        prompt[:, :width] = head.columns
        prompt[0, width:] = suffix
        self.check_fits(prompt.shape[1], what=f"text of {len(target_ids)} tokens{head.what}")
        return prompt

    def _check_codes(self, ref_codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(ref_codes)
        k, size = self.config.num_codebooks, self.config.codebook_size
        if codes.ndim != 2 or codes.shape[0] != k:
            raise PromptError(f"reference codes must have shape [{k}, frames], got {list(codes.shape)}")
        if codes.shape[1] == 0:
            raise PromptError("reference codes have no frames: the reference clip is empty")
        if not np.issubdtype(codes.dtype, np.integer):
            raise PromptError(f"reference codes must be integers, got dtype {codes.dtype}")
        bad = (codes < 0) | (codes >= size)
        if bad.any():
            row, col = (int(x[0]) for x in np.nonzero(bad))
            raise PromptError(
                f"reference code {int(codes[row, col])} at codebook {row}, frame {col} is outside "
                f"[0, {size}): the codes come from another codec or are corrupt"
            )
        return codes.astype(np.int64)

    def check_fits(self, prompt_len: int, max_new_frames: int = 1, what: str = "") -> None:
        """Raise :class:`PromptError` unless ``prompt_len + max_new_frames <= max_seq_len``.

        The slow AR's KV cache and RoPE table hold ``max_seq_len`` positions for the prompt and the frames.
        The publisher requires a prompt strictly shorter than ``max_seq_len`` (the default of one frame
        checks exactly that) and clips its frame budget to ``max_seq_len - prompt_len``; callers that
        prefer an error over a clipped utterance pass their ``max_new_frames``. ``what`` describes the
        prompt's content for the message.
        """
        limit = self.config.max_seq_len
        if prompt_len + max_new_frames <= limit:
            return
        content = f" ({what})" if what else ""
        if prompt_len >= limit:
            raise PromptTooLong(
                f"the prompt is {prompt_len} tokens{content} but the model's context "
                f"(max_seq_len) is {limit}, which must also hold the generated frames: "
                "shorten the text or use a shorter reference clip, or let it be split into sentences "
                "(audio8 say, TTS.synthesize and TTS.stream split long text)"
            )
        raise PromptTooLong(
            f"the prompt is {prompt_len} tokens{content}; with max_new_frames {max_new_frames} "
            f"that is {prompt_len + max_new_frames} positions, over max_seq_len {limit}: at most "
            f"{limit - prompt_len} frames fit, so lower max_new_frames or shorten the text"
        )
