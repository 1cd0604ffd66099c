"""Binding Python calls against the torch_npu operator schemas kept in `torch_npu_schemas.json`.

The JSON is extracted from the torch-npu wheel by `scripts/extract_torch_npu_schemas.py`, so
the emulator's signatures (argument order, keyword-only arguments, defaults, types) follow the
real operators as data: when the schema changes, binding changes with it. The same strings
define the emulated torch operators (`registry.register_operator`), whose CPU and fake kernels
use `bind_overload` to name the arguments torch passes them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import torch

from .int_lists import integer_list

SCHEMA_FILE = Path(__file__).resolve().parent / "torch_npu_schemas.json"


@functools.cache
def schema_document() -> dict:
    """The parsed `torch_npu_schemas.json` (source wheel, version, operators)."""
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def overloads(op: str) -> list[dict]:
    """Every schema overload of `op`, the default overload ("") first."""
    try:
        found = schema_document()["operators"][op]
    except KeyError:
        raise KeyError(f"{op} has no schema in {SCHEMA_FILE.name}") from None
    return sorted(found, key=lambda schema: schema["overload"] != "")


@dataclasses.dataclass
class BoundCall:
    """A call bound to one schema overload: every argument by name, defaults filled in."""

    op: str
    overload: str
    arguments: dict[str, Any]
    defaults: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["arguments"][name]
        except KeyError:
            raise AttributeError(f"{self.op} has no argument {name!r}") from None

    def require_defaults(self, handled: set[str]) -> None:
        """NotImplementedError naming every argument outside `handled` that is not its default."""
        changed = [
            name for name, value in self.arguments.items()
            if name not in handled and not _same(value, self.defaults.get(name))
        ]
        if changed:
            raise NotImplementedError(
                f"{self.op}: argument(s) {changed} are not emulated; leave them at their "
                "schema defaults"
            )


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, torch.Tensor) or isinstance(default, torch.Tensor):
        return False
    return value == default


def bind(op: str, args: tuple, kwargs: dict) -> BoundCall:
    """Bind a Python call to the first overload of `op` that accepts it, or raise TypeError."""
    errors = []
    for schema in overloads(op):
        try:
            return _bind_overload(op, schema, args, kwargs)
        except TypeError as error:
            errors.append(str(error))
    raise TypeError(errors[0] if len(errors) == 1 else " | ".join(errors))


def bind_overload(op: str, overload: str, args: tuple, kwargs: dict) -> BoundCall:
    """Bind a call to one named overload of `op` ("" is the default), or raise TypeError.

    The CPU kernels use it: torch has bound the call already and passes trailing defaults
    only when given, so this fills them in and names every argument.
    """
    for schema in overloads(op):
        if schema["overload"] == overload:
            return _bind_overload(op, schema, args, kwargs)
    raise KeyError(f"{op} has no overload {overload!r} in {SCHEMA_FILE.name}")


def _bind_overload(op: str, schema: dict, args: tuple, kwargs: dict) -> BoundCall:
    name = op + (f".{schema['overload']}" if schema["overload"] else "")
    params = schema["arguments"]
    positional = [p for p in params if not p["keyword_only"]]
    if len(args) > len(positional):
        raise TypeError(
            f"{name}() takes {len(positional)} positional arguments but {len(args)} were given "
            f"(arguments after '*' are keyword-only): {schema['schema']}"
        )
    known = {p["name"] for p in params}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"{name}() got an unexpected keyword argument {unknown[0]!r}")
    values = dict(zip((p["name"] for p in positional), args, strict=False))
    for key, value in kwargs.items():
        if key in values:
            raise TypeError(f"{name}() got multiple values for argument {key!r}")
        values[key] = value
    arguments = {}
    for param in params:
        if param["name"] in values:
            arguments[param["name"]] = values[param["name"]]
        elif param["has_default"]:
            arguments[param["name"]] = param["default"]
        else:
            raise TypeError(f"{name}() missing required argument {param['name']!r}")
        arguments[param["name"]] = check_type(name, param, arguments[param["name"]])
    defaults = {p["name"]: p["default"] for p in params if p["has_default"]}
    return BoundCall(op, schema["overload"], arguments, defaults)


def check_type(name: str, param: dict, value: Any) -> Any:
    """`value` as bound to `param` (an integer sequence as a list of ints), or TypeError
    unless it is what the schema type of `param` accepts."""
    schema_type = param["type"]
    base = schema_type.rstrip("?").split("(")[0]
    if value is None:
        if schema_type.endswith("?"):
            return None
        raise TypeError(f"{name}(): argument {param['name']!r} ({schema_type}) may not be None")
    if base.endswith("]"):
        element = base[: base.index("[")]
        if element in ("int", "SymInt"):
            return _integer_list(name, param, value)
        _check_list(name, param, element, value)
    elif not _scalar_ok(base, value):
        raise TypeError(
            f"{name}(): argument {param['name']!r} must be {schema_type}, "
            f"got {type(value).__name__}"
        )
    return value


def _integer_list(name: str, param: dict, value: Any) -> list[int]:
    """An `int[]`/`SymInt[]` argument: what torch's binder takes as integers (`int_lists`)."""
    items = integer_list(value)
    if items is None:
        raise TypeError(
            f"{name}(): argument {param['name']!r} ({param['type']}) must be a sequence of "
            "integers (a list, tuple or range of ints, or a 1-D integer numpy array or tensor), "
            f"got {_describe(value)}"
        )
    return items


def _describe(value: Any) -> str:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(value).__name__} of shape {tuple(shape)} and dtype {dtype}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {sorted({type(item).__name__ for item in value})}"
    return type(value).__name__


def _check_list(name: str, param: dict, element: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        raise TypeError(
            f"{name}(): argument {param['name']!r} must be a list or tuple ({param['type']}), "
            "got torch.Tensor; wrap the tensors in a list"
        )
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{name}(): argument {param['name']!r} must be a list or tuple ({param['type']}), "
            f"got {type(value).__name__}"
        )
    for index, item in enumerate(value):
        if not _scalar_ok(element, item):
            raise TypeError(
                f"{name}(): argument {param['name']!r}[{index}] must be {element}, "
                f"got {type(item).__name__}"
            )


def _scalar_ok(base: str, value: Any) -> bool:
    if base == "Tensor":
        return isinstance(value, torch.Tensor)
    if base in ("int", "SymInt"):
        # torch's own binder takes a dtype for an int and passes its ScalarType value (12 for
        # torch.qint8): vllm-ascend calls npu_quantize's `int dtype` so.
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            base == "int" and isinstance(value, torch.dtype)
        )
    if base == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base == "bool":
        return isinstance(value, bool)
    if base == "str":
        return isinstance(value, str)
    if base == "ScalarType":
        return isinstance(value, torch.dtype)
    raise NotImplementedError(f"schema type {base!r} is not supported by the emulator's binder")
