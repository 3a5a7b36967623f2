"""The log-mel spectrogram the gate compares decodes with and draws (128 mels, n_fft 2048, hop 512)."""

from __future__ import annotations

import numpy as np

from ..stats import cosine

N_MELS, N_FFT, HOP = 128, 2048, 512
LOG_FLOOR = 1e-5  # added to the mel power before the log: the earlier port's definition (PORT-NOTES 4.2)


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (200/3 Hz a mel) below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(hz < 1000.0, hz * 3.0 / 200.0, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / log_step)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(mel < 15.0, mel * 200.0 / 3.0, 1000.0 * np.exp(log_step * (mel - 15.0)))


def mel_filterbank(sample_rate: int, n_fft: int = N_FFT, n_mels: int = N_MELS) -> np.ndarray:
    """Triangular mel filters, float64 [n_mels, n_fft // 2 + 1], 0 Hz to Nyquist.

    Slaney's mel scale and area normalisation (each filter scaled by 2 / its width in Hz): the defaults of
    ``librosa.filters.mel``, so the log-mel here is the one most published comparisons use.
    """
    fft_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), n_mels + 2))
    width = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    rising, falling = -ramps[:-2] / width[:-1, None], ramps[2:] / width[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def log_mel(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Log-mel spectrogram of mono ``audio`` [N] -> float32 [128, 1 + N // 512].

    Centred frames (zero-padded by n_fft/2 each side), periodic Hann window of 2048, hop 512, power spectrum,
    128 Slaney mel filters (:func:`mel_filterbank`), then ``log(mel + 1e-5)``.
    """
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    x = np.pad(x, N_FFT // 2)
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    return np.log(mel_filterbank(sample_rate) @ power.T + LOG_FLOOR).astype(np.float32)


def log_mel_cos(a: np.ndarray, b: np.ndarray, sample_rate: int) -> float:
    """Cosine of the log-mel spectrograms of two mono signals, over their common length."""
    n = min(len(a), len(b))
    return cosine(log_mel(a[:n], sample_rate), log_mel(b[:n], sample_rate))
