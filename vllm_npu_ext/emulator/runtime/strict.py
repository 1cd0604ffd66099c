"""Strict stand-in modules: a name they do not implement is an error that names it.

vllm-ascend's own unit tests stand torch_npu in with a `MagicMock`, under which every name
exists and every call "works". The stand-in's modules instead hold only what is implemented;
any other attribute raises AttributeError naming the module, the attribute and this package
(so `hasattr`/`getattr(..., default)` see what they would see on a torch_npu without it).
Every implemented name read from outside the stand-in is recorded in `touched`: the list of
torch_npu / torch.npu names the code under test actually used.
"""

from __future__ import annotations

import collections
import sys
from types import ModuleType
from typing import Any

# "torch.npu.current_stream" -> number of reads from outside the stand-in.
touched: collections.Counter[str] = collections.Counter()
_OWN_PACKAGE = __name__.rsplit(".", 1)[0]


class StrictModule(ModuleType):
    """A module whose missing attributes raise AttributeError naming them."""

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if not name.startswith("__") and not _read_by_stand_in():
            touched[f"{super().__getattribute__('__name__')}.{name}"] += 1
        return value

    def __getattr__(self, name: str) -> Any:
        module = super().__getattribute__("__name__")
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        raise AttributeError(
            f"{module}.{name} is not implemented by the torch_npu stand-in ({_OWN_PACKAGE}); "
            "add it there, with the real contract, if the code under test needs it"
        )


def _read_by_stand_in() -> bool:
    caller = sys._getframe(2).f_globals.get("__name__", "")
    return caller.startswith(_OWN_PACKAGE)


def strict_module(name: str, doc: str, **attributes: Any) -> StrictModule:
    module = StrictModule(name, doc)
    module.__dict__.update(attributes)
    return module


class NotEmulated:
    """Base of classes that exist for annotations and isinstance checks only: constructing
    one raises NotImplementedError naming it."""

    qualified_name = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"{self.qualified_name} is not emulated by the torch_npu stand-in ({_OWN_PACKAGE})"
        )


def not_emulated(qualified_name: str, **members: Any) -> type:
    """A NotEmulated class named after `qualified_name` (with extra class members)."""
    cls = type(qualified_name.rsplit(".", 1)[1], (NotEmulated,), dict(members))
    cls.qualified_name = qualified_name
    return cls
