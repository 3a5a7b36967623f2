"""Text in: the tokenizers, text checks, the long-text splitter and the [num_codebooks + 1, P] prompt builder."""

from ..errors import PromptError, PromptTooLong, TokenizerError
from .checks import check_text, check_unicode, clean_text
from .languages import LANGUAGES, language_warning
from .prompt import PromptBuilder
from .split import split_text
from .tokenizer import build_qwen_tokenizer, build_tiny_tokenizer, load_tokenizer, write_tokenizer_files

__all__ = [
    "LANGUAGES",
    "PromptBuilder",
    "PromptError",
    "PromptTooLong",
    "TokenizerError",
    "build_qwen_tokenizer",
    "build_tiny_tokenizer",
    "check_text",
    "check_unicode",
    "clean_text",
    "language_warning",
    "load_tokenizer",
    "split_text",
    "write_tokenizer_files",
]
