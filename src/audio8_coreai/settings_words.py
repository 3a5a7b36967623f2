"""What a settings field (:mod:`.settings`) takes, said in words for the errors of a variable or an option."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from typing import Literal

from pydantic.fields import FieldInfo


def takes(info: FieldInfo, typed: bool = True) -> str:
    """What a field takes, in words: 'a whole number 1 to 65535', 'a finite number > 0', 'one of 8000, 11025...';
    ``typed`` False (a CLI option, whose type the CLI has checked) leaves out 'a whole number' and 'or none'."""
    limits = {k: v for m in info.metadata for k in ("ge", "gt", "le", "lt") if (v := getattr(m, k, None)) is not None}
    if "ge" in limits and "le" in limits:
        bounds = f"{limits['ge']} to {limits['le']}"
    else:
        signs = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
        bounds = " and ".join(f"{sign} {limits[k]}" for k, sign in signs if k in limits)
    kind, optional = kind_of(info)
    if typing.get_origin(kind) is Literal:
        said = "one of " + ", ".join(map(str, typing.get_args(kind)))
    elif kind is bool:
        return "true, false or none" if typed and optional else "true or false"
    elif kind in (int, float):
        number = "a finite number" if kind is float else "a whole number" if typed else ""  # settings refuse inf
        said = " ".join(filter(None, (number, bounds)))
    elif typing.get_origin(kind) in (tuple, dict):
        example = (info.examples or [None])[0] or info.get_default(call_default_factory=True)
        example = example or ([1, 4] if typing.get_origin(kind) is tuple else {"a": "b"})
        said = "JSON such as " + json.dumps(example)
    else:
        said = "non-empty text" if any(getattr(m, "min_length", 0) for m in info.metadata) else "text"
    return said + (" or none" if typed and optional else "")


def kind_of(info: FieldInfo) -> tuple[object, bool]:
    """A field's type without None, and whether it takes None."""
    if typing.get_origin(info.annotation) not in (typing.Union, types.UnionType):
        return info.annotation, False
    kinds = [a for a in typing.get_args(info.annotation) if a is not type(None)]
    return (kinds[0] if len(kinds) == 1 else str), len(kinds) < len(typing.get_args(info.annotation))


def wrong_variable(name: str, info: FieldInfo | None, error: Mapping) -> str:
    """What an environment variable ``name`` setting the field ``info`` got wrong (``error``: pydantic's)."""
    if info is None and error["type"] in ("model_type", "dict_type"):  # a group's own variable, not an object
        return f'{name} is a group: give it as a JSON object, e.g. {{"port": 8000}}, or set {name}__<FIELD>'
    if info is None or error["type"] == "value_error":
        return f"{name}: {str(error['msg']).removeprefix('Value error, ')}"
    return f"{name} must be {takes(info)}, got {error['input']!r}"
