"""The base of every error this package raises on purpose.

Each module keeps its own error class (ConfigError, CheckpointError, PromptError, AudioError, VoiceError,
EngineError, BackendError, ...), all subclasses of :class:`Audio8Error`, so a caller can catch them in one
``except`` and show the message, which says what to do. Anything else escaping the package is a bug.
"""


class Audio8Error(Exception):
    """An input, file or setting this package cannot use; the message names it and what to change."""
