"""audio8-coreai: Audio8-TTS-Preview-0.6b from the publisher's checkpoint, in PyTorch and Apple Core AI.

Public API::

    from audio8_coreai import TTS
    tts = TTS.load("Audio8/Audio8-TTS-Preview-0.6b")   # or a local checkpoint folder
    audio, sample_rate = tts.synthesize("Hello, world!", seed=0)
"""

from .tts import TTS, Synthesis

__all__ = ["TTS", "Synthesis"]
__version__ = "0.1.0"
