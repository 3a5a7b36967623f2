"""The device check's import gate: in seconds, whether everything the later parts need is there.

    python benchmarks/device_gate.py [--device cuda] [--wheel soundfile==0.14.0 ...] [--json out.json]

Checked, in order (the first failure ends the gate with exit status 1, every check until then in the JSON): torch
imports and, on ``--device cuda``, sees a GPU that runs one kernel; each carried ``--wheel`` (``name==version``)
imports at that version (the carried one, not another on the path); ``audio8_coreai`` and the modules the parts
use import. A missing oracle is the tests' failure alone, not the gate's.
The JSON: ``{"checks": [{"check", "ok", "detail"}], "ok": bool, "machine": {...}}``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

# what the parts import (tests, bench_gpu, profile_gpu, agreement, the checkpoint); not the CLI, which they never run
PART_MODULES = (
    "audio8_coreai",
    "audio8_coreai.backends.torch",
    "audio8_coreai.backends.torch.codec_rows",
    "audio8_coreai.engine.batch",
    "audio8_coreai.measure.agreement",
    "audio8_coreai.measure.bench",
    "audio8_coreai.settings",
    "torch.nn.attention",
    "torch.profiler",
    "pytest",
)


def torch_check(machine: dict) -> str:
    import torch

    machine.update(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda)
    return f"{torch.__version__} (CUDA {torch.version.cuda})"


def cuda_check(device: str, machine: dict) -> str:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    total = float((torch.arange(4.0, device=device) * 2).sum())  # a kernel launched and read back
    if total != 12.0:
        raise RuntimeError(f"a CUDA kernel returned {total}, not 12.0")
    machine.update(gpu=torch.cuda.get_device_name(device), capability=torch.cuda.get_device_capability(device))
    return f"{machine['gpu']} (sm {machine['capability']})"


# a carried distribution whose module is not its name with "_" for "-"
MODULE_OF = {"python-dotenv": "dotenv"}


def wheel_check(wheel: str) -> str:
    name, _, wanted = wheel.partition("==")
    module = importlib.import_module(MODULE_OF.get(name, name.replace("-", "_")))
    found = version(name)
    if wanted and found != wanted:
        raise RuntimeError(f"{name} {found} imported, not the carried {wanted} ({module.__file__})")
    return f"{found} from {Path(module.__file__).parent}"


def gate(args: argparse.Namespace, machine: dict) -> list[tuple[str, Callable[[], str]]]:
    """The checks in order, as (name, check returning its detail or raising)."""
    steps = [("torch", lambda: torch_check(machine))]
    if args.device.startswith("cuda"):
        steps.append(("cuda", lambda: cuda_check(args.device, machine)))
    steps += [(f"wheel {w}", lambda w=w: wheel_check(w)) for w in args.wheel]
    steps += [(f"import {m}", lambda m=m: str(importlib.import_module(m).__name__)) for m in PART_MODULES]
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--wheel", action="append", default=[], help="a carried wheel as name==version (repeatable)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    machine: dict = {"device": args.device}
    report = {"checks": [], "ok": False, "machine": machine}
    for name, check in gate(args, machine):
        try:
            report["checks"].append({"check": name, "ok": True, "detail": check()})
        except Exception as e:  # the gate's job: any failure named, then stop
            report["checks"].append({"check": name, "ok": False, "detail": f"{type(e).__name__}: {e}"})
            break
    report["ok"] = report["checks"][-1]["ok"]
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    last = report["checks"][-1]
    print(
        f"gate: {'ok' if report['ok'] else 'FAILED'}: {len(report['checks'])} checks, last {last['check']}: "
        f"{last['detail']}; {json.dumps(machine)}"
    )
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
