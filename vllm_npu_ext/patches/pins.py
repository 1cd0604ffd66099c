"""Source pins: a patch replaces or wraps another package's function only if that function is
the one the patch was verified on.

Each pinned function is named `"module:qualname"` in the patch table (`patches/__init__.py`)
with the sha256 of its source for every version it was verified on. The hash covers the
function's syntax tree (`ast.unparse` of its definition, decorators and docstring included,
comments and layout not), so `inspect.getsource` at run time and the text of an unpacked
wheel or sdist (`scripts/check_vllm_ascend_patch.py`) hash alike. A source that matches no pin
is refused: the patch is not applied, a warning names the function and what to do, and
`vllm-npu-ext doctor` reports it. Listing the hash in VLLM_NPU_EXT_ACCEPT_PATCH_SOURCES applies
the patch anyway, for someone who checked that it still fits.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from vllm_npu_ext import envs

# "module:qualname" -> {version it was verified on: sha256}
Pins = Mapping[str, Mapping[str, str]]


def _node_hash(node: ast.AST) -> str:
    return hashlib.sha256(ast.unparse(node).encode()).hexdigest()


def source_hash(function: Callable) -> str:
    """sha256 of `function`'s definition (through `functools.wraps` wrappers to the original).

    Read from its module's source where it is defined at module or class level, as
    `source_hash_in_module` reads a file: the definition's own text dedented would change the
    lines of a multi-line string in it, and the two hashes of one function would differ."""
    function = inspect.unwrap(function)
    qualname = getattr(function, "__qualname__", "")
    module = inspect.getmodule(function)
    if module is not None and "<" not in qualname:
        try:
            digest = source_hash_in_module(inspect.getsource(module), qualname)
        except (OSError, TypeError, SyntaxError):
            digest = None
        if digest is not None:
            return digest
    source = textwrap.dedent(inspect.getsource(function))
    return _node_hash(ast.parse(source).body[0])


def source_hash_in_module(module_source: str, qualname: str) -> str | None:
    """sha256 of the definition `qualname` ("Class.method" or "function") in a module's source
    text, as `source_hash` computes it for the imported function; None if it is not there."""
    scope: list[ast.stmt] = ast.parse(module_source).body
    node = None
    for part in qualname.split("."):
        defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        node = next((n for n in scope if isinstance(n, defs) and n.name == part), None)
        if node is None:
            return None
        scope = node.body
    return _node_hash(node)


def accepted_hashes() -> set[str]:
    """The hashes listed in VLLM_NPU_EXT_ACCEPT_PATCH_SOURCES."""
    return {item.strip().lower() for item in envs.ACCEPT_PATCH_SOURCES().split(",") if item.strip()}


@dataclasses.dataclass(frozen=True)
class Check:
    """One pinned function as found: `status` is "ok" (a pinned source), "accepted" (listed in
    VLLM_NPU_EXT_ACCEPT_PATCH_SOURCES), "mismatch" (neither: refused), "absent" (its package is
    not installed) or "unchecked" (it could not be imported here; `detail` says why)."""

    patch: str
    target: str
    status: str
    sha256: str | None = None
    detail: str = ""

    @property
    def refused(self) -> bool:
        """A source that matches no pin: a problem wherever it is found."""
        return self.status == "mismatch"

    @property
    def applicable(self) -> bool:
        """Whether a patch may go ahead: its target verified, accepted, or not installed (then
        the patch finds nothing to change). Unchecked is refused too: fail closed."""
        return self.status in ("ok", "accepted", "absent")

    def message(self) -> str:
        """What went wrong and what to do, for the log and the doctor."""
        if self.status == "unchecked":
            return f"patch {self.patch} not applied: {self.target} not found ({self.detail})"
        return (
            f"patch {self.patch} not applied: the source of {self.target} (sha256 {self.sha256}) "
            f"is not one it was verified on ({self.detail}). Install a verified version, or "
            f"check that the patch still fits this source and set "
            f"{envs.ACCEPT_PATCH_SOURCES.name}={self.sha256} to apply it anyway"
        )


def _compare(patch: str, target: str, digest: str, pinned: Mapping[str, str]) -> Check:
    if digest in pinned.values():
        return Check(patch, target, "ok", digest)
    verified = ", ".join(pinned) or "no version"
    status = "accepted" if digest in accepted_hashes() else "mismatch"
    return Check(patch, target, status, digest, f"verified on {verified}")


def module_file(module_name: str) -> Path | None:
    """The source file of `module_name`, found without importing anything (a package's
    `__init__` may import much); None when its top-level package is not installed."""
    top, *rest = module_name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    base = Path(next(iter(spec.submodule_search_locations or ()), Path(spec.origin).parent))
    path = base.joinpath(*rest)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _live_hash(module: ModuleType, qualname: str) -> str:
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part)
    return source_hash(found)


def _file_hash(module_name: str, qualname: str) -> str | None:
    path = module_file(module_name)
    if path is None:
        return None
    digest = source_hash_in_module(path.read_text(encoding="utf-8"), qualname)
    if digest is None:
        raise LookupError(f"no {qualname} in {path}")
    return digest


def check_target(patch: str, target: str, pinned: Mapping[str, str],
                 lookup: Callable[[str], Any] | None = None) -> Check:  # fmt: skip
    """Compare the function `target` ("module:qualname") names with its pins.

    The function is `lookup(target)` when given (a patch holding its target module), the live
    object when its module is imported (what a patch would replace), else read from the module's
    file without importing it (what an import would load): "absent" when its package is not
    installed, "unchecked" when it cannot be found."""
    module_name, _, qualname = target.partition(":")
    try:
        if lookup is not None:
            digest = source_hash(lookup(target))
        elif module_name in sys.modules:
            digest = _live_hash(sys.modules[module_name], qualname)
        else:
            digest = _file_hash(module_name, qualname)
            if digest is None:
                top = module_name.partition(".")[0]
                return Check(patch, target, "absent", detail=f"{top} is not installed")
    except Exception as error:  # another package's code may raise anything
        return Check(patch, target, "unchecked", detail=f"{type(error).__name__}: {error}")
    return _compare(patch, target, digest, pinned)


def check_all(patch: str, pins: Pins, lookup: Callable[[str], Any] | None = None,
              needs: str | None = None) -> list[Check]:  # fmt: skip
    """Every pin of one patch, checked; all "absent" where the package `needs` names (without
    which the patch never applies, e.g. vllm_ascend for a pin of vLLM it relies on there) is
    not installed."""
    if needs is not None and needs not in sys.modules and importlib.util.find_spec(needs) is None:
        return [Check(patch, target, "absent", detail=f"{needs} is not installed")
                for target in pins]  # fmt: skip
    return [check_target(patch, target, pinned, lookup) for target, pinned in pins.items()]
