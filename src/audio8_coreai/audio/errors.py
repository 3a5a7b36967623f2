"""The error for audio that cannot be read or written as asked."""

from ..errors import Audio8Error


class AudioError(Audio8Error, ValueError):
    """An audio file cannot be written (or read) as asked; the message says what to do."""
