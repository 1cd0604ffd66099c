"""Patch a module when it is imported, without importing it earlier.

A patch that must not import its target up front (the target is heavy, or it is imported only
in some processes) installs a `PatchOnImport` finder: when the target is imported, the real
loader runs and then the patch function gets the fresh module. Modules already imported are
patched at once by `install`.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from types import ModuleType

Patch = Callable[[ModuleType], object]


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the fresh module."""

    def __init__(self, loader, patch: Patch):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # get_source, get_code, ... for inspect and tracebacks
        return getattr(self._loader, name)


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the target modules through the other finders and wraps their loader.

    `patches` maps a module's full name to the function that patches it.
    """

    def __init__(self, patches: dict[str, Patch]):
        self.patches = patches

    def find_spec(self, fullname, path, target=None):
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def install(finder: PatchOnImport) -> None:
    """Put `finder` first on `sys.meta_path` (once per finder type) and patch what is loaded."""
    if not any(type(f) is type(finder) for f in sys.meta_path):
        sys.meta_path.insert(0, finder)
    for name, patch in finder.patches.items():
        if name in sys.modules:
            patch(sys.modules[name])


def uninstall(finder_type: type[PatchOnImport]) -> None:
    """Remove every finder of `finder_type` from `sys.meta_path` (loaded modules stay)."""
    sys.meta_path[:] = [f for f in sys.meta_path if type(f) is not finder_type]
