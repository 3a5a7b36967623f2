"""The LAME gapless tag of a streamed mp3: the encoder delay a decoder trims, written before the length is known."""

from __future__ import annotations

# LAME's encoder delay (samples) at every rate and bit rate this project encodes (LAME 3.100 writes 576 in the
# whole-file tag at 8-48 kHz; decoders add their own 529).
ENCODER_DELAY = 576
_VERSION = b"LAME3.100"  # ffmpeg and mpg123 read the delay only from a tag whose version starts with LAME
_CBR = 0x01  # tag revision 0, VBR method 1 (constant bit rate)


def _side_info_bytes(header: bytes) -> int:
    """Layer III side information after a mono frame's 4-byte header: 17 bytes in MPEG-1, 9 in MPEG-2 and 2.5."""
    mpeg1 = (header[1] >> 3) & 0b11 == 0b11
    return 17 if mpeg1 else 9


def _crc16(data: bytes) -> int:
    """CRC-16/ARC (polynomial 0x8005, reflected, initial 0): the LAME tag's own checksum."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


def tag_span(header: bytes) -> int:
    """Bytes from a frame's start to the end of its LAME tag (an Info tag with no optional fields)."""
    return 4 + _side_info_bytes(header) + 8 + 36


def gapless_tag(header: bytes) -> bytes:
    """The first :func:`tag_span` bytes of the blank first frame that LAME leaves for its tag, filled in: the
    frame's own 4-byte ``header`` (mono layer III), side information of zeros, an "Info" (constant bit rate) tag
    with no frame count, byte count or seek table (unknown while streaming), and a LAME tag that gives
    ENCODER_DELAY and a padding of 0 (decoders then keep up to one frame of silence at the end), with its
    CRC-16. Layout: LAME's "Mp3 Info Tag rev 1" specification."""
    side = bytes(_side_info_bytes(header))
    xing = b"Info" + bytes(4)  # flags 0: no optional fields
    lame = _VERSION + bytes([_CBR]) + bytes(11) + (ENCODER_DELAY << 12).to_bytes(3, "big") + bytes(10)
    head = header[:4] + side + xing + lame
    return head + _crc16(head).to_bytes(2, "big")
