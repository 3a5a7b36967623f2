"""Core AI: convert the graphs to ``.aimodel`` assets, then load and run them (DESIGN.md principle 1).

Only published packages are used: ``coreai-torch`` (torch.export programs -> Core AI), ``coreai-opt`` (int8
weights for ``int8-fp16``) and ``coreai-core`` (the asset format and ``coreai.runtime``, which runs assets natively
on Apple devices and, on Linux, in a CPU interpreter: slow, but it is how tests prove an asset right).

The converter: ``weights`` (the modules in a precision), ``export`` (the asset functions and torch.export),
``convert`` (coreai-torch, the folder). The runtime: ``runtime`` (:class:`CoreAIBackend`). Both share
``manifest`` (the asset folder's format, the dualar contract and the manifest each asset carries).
"""

from ...errors import AssetError
from .convert import convert
from .manifest import PARTS, read_manifest
from .runtime import CoreAIBackend

__all__ = ["PARTS", "AssetError", "CoreAIBackend", "convert", "read_manifest"]
