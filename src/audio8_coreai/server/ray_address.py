"""The Ray cluster ``audio8 serve --ray --address`` names: refused in seconds, with what to give instead, when
nothing answers there (ray.init would retry for minutes)."""

from __future__ import annotations

import socket

from ..errors import ConfigError


def cannot_join(address: str, said: str) -> ConfigError:
    """The ConfigError of a Ray cluster not reached at ``address`` (``said``: why), with the addresses that work."""
    return ConfigError(
        f"cannot join the Ray cluster at {address} ({said}); give --address HEAD_IP:6379 (what `ray start --head` "
        "printed), auto for the cluster this machine belongs to, or no --address for a Ray instance of its own"
    )


def check_answers(address: str) -> None:
    """Raise ConfigError unless something accepts a TCP connection at ``address`` (``[ray://]HOST:PORT``) within
    5 s: ray.init retries an address nobody answers at for minutes. Other forms are left to Ray."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if "://" in host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise cannot_join(address, str(e) or type(e).__name__) from None
