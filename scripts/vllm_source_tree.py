"""Static reading of a vLLM source tree for scripts/check_vllm_compat.py.

`SourceTree` resolves module paths, top-level bindings (star re-exports, submodules, names a
module's `__getattr__` serves) and call signatures by parsing the files with `ast`; nothing
of the tree is imported.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

OK, MISSING, OPTIONAL_MISSING, UNCHECKED = "OK", "MISSING", "OPTIONAL-MISSING", "UNCHECKED"
PLAIN_BASES = {"object", "Enum", "IntEnum", "StrEnum", "str", "int", "ABC", "Protocol", "Generic"}
# Decorators that keep the decorated function's keyword parameters.
KEEP_SIGNATURE = {"cache", "lru_cache", "wraps", "staticmethod", "classmethod", "override",
                  "abstractmethod", "no_grad", "inference_mode", "overload", "deprecated"}
DATACLASS_DECORATORS = {"dataclass", "config"}
# Bases whose subclasses take their annotated fields as constructor keywords, as a dataclass does
# (msgspec.Struct: vLLM's PoolingParams and SamplingParams).
FIELD_BASES = {"Struct"}


@dataclass(frozen=True)
class Binding:
    """What a module binds a name to; `source`/`source_name` for import bindings."""

    node: ast.AST
    lazy: bool = False  # declared under `if TYPE_CHECKING:`, served by `__getattr__`
    source: str = ""
    source_name: str = ""


@dataclass
class ModuleInfo:
    bindings: dict[str, Binding] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)  # modules of `from M import *`
    all_names: list[str] | None = None  # literal `__all__`, None when absent or computed
    getattr_names: set[str] = field(default_factory=set)  # what a module `__getattr__` serves
    parsed: bool = True  # False for extension modules and namespace packages


@dataclass
class Signature:
    names: set[str]
    any_keyword: bool = False  # `**kwargs`
    opaque: bool = False  # a decorator that may change the signature


def _simple_name(node: ast.AST) -> str:
    """`a.b.C` / `C` / `C[...]` / `C(...)` -> "C" ("" for anything else)."""
    while isinstance(node, ast.Subscript | ast.Call):
        node = node.value if isinstance(node, ast.Subscript) else node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _is_type_checking(test: ast.AST) -> bool:
    return _simple_name(test) == "TYPE_CHECKING"


def _absolute(module: str, package: str, level: int) -> str:
    """The module an `from <level dots><module> import` inside `package` names."""
    if level == 0:
        return module
    parts = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(parts + ([module] if module else []))


def _string_list(node: ast.AST | None) -> list[str] | None:
    if isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [e.value for e in node.elts]
    return None


class SourceTree:
    """A vLLM source tree, read with `ast` and never imported."""

    def __init__(self, path: Path):
        path = Path(path)
        if (path / "vllm" / "__init__.py").is_file():
            self.root = path
        elif path.name == "vllm" and (path / "__init__.py").is_file():
            self.root = path.parent
        else:
            raise ValueError(f"path: {path} neither is nor contains the vllm package directory")
        self._infos: dict[str, ModuleInfo | None] = {}

    def version(self) -> str:
        for name in ("_version.py", "version.py"):
            file = self.root / "vllm" / name
            found = file.is_file() and re.search(r"__version__\s*=.*?['\"]([^'\"]+)['\"]",
                                                 file.read_text(encoding="utf-8"))
            if found:
                return found.group(1)
        return "unknown"

    def _path(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        extensions = sorted(base.parent.glob(base.name + ".*.so")) if base.parent.is_dir() else []
        return extensions[0] if extensions else (base if base.is_dir() else None)

    def exists(self, module: str) -> bool:
        return self._path(module) is not None

    def info(self, module: str) -> ModuleInfo | None:
        if module not in self._infos:
            path = self._path(module)
            if path is None or path.suffix != ".py":
                self._infos[module] = None if path is None else ModuleInfo(parsed=False)
            else:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
                self._infos[module] = _module_info(tree.body, package)
        return self._infos[module]

    def lookup(self, module: str, name: str, seen: frozenset = frozenset()) -> tuple[str, str]:
        """(status, how) of `name` in `module`."""
        info = self.info(module)
        if info is None:
            return MISSING, "module missing"
        if self.exists(f"{module}.{name}"):
            return OK, "submodule"
        if not info.parsed:
            return UNCHECKED, "not a Python source module"
        binding = info.bindings.get(name)
        if binding and not binding.lazy:
            return OK, "defined"
        if (binding and "__getattr__" in info.bindings) or name in info.getattr_names:
            return OK, "module __getattr__"
        for star in info.stars:
            if star not in seen and name in self.exports(star, seen | {module}):
                return OK, f"from {star} import *"
        if "__getattr__" not in info.bindings:
            return MISSING, "not defined"
        if info.getattr_names or any(b.lazy for b in info.bindings.values()):
            return MISSING, "not declared for the module's __getattr__"
        return UNCHECKED, "the module's __getattr__ may serve it"

    def exports(self, module: str, seen: frozenset = frozenset()) -> set[str]:
        """Names `from module import *` binds."""
        info = self.info(module)
        if info is None or not info.parsed:
            return set()
        if info.all_names is not None:
            return set(info.all_names)
        names = {n for n, b in info.bindings.items() if not n.startswith("_") and not b.lazy}
        for star in info.stars:
            if star not in seen:
                names |= self.exports(star, seen | {module})
        return names

    def definition(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """(module, def or class node) that `module.name` finally refers to, imports followed."""
        info = self.info(module)
        if info is None or not info.parsed or depth > 20:
            return None
        binding = info.bindings.get(name)
        if binding is None:
            star = next((s for s in info.stars if name in self.exports(s)), None)
            return self.definition(star, name, depth + 1) if star else None
        if isinstance(binding.node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return module, binding.node
        if binding.source and binding.source_name:
            return self.definition(binding.source, binding.source_name, depth + 1)
        return None

    def class_member(self, module: str, cls: ast.ClassDef, name: str) -> tuple[str, str]:
        """(status, how) of the class attribute `cls.name`, inherited ones included."""
        if name in _module_info(cls.body, module).bindings:
            return OK, "class member"
        complete = True
        for base in cls.bases:
            found = self.definition(module, base.id) if isinstance(base, ast.Name) else None
            if found and isinstance(found[1], ast.ClassDef):
                status, how = self.class_member(found[0], found[1], name)
                if status == OK:
                    return status, how
                complete = complete and status == MISSING
            elif _simple_name(base) not in PLAIN_BASES:
                complete = False
        return (MISSING, "not a class member") if complete else (UNCHECKED, "unresolved base")

    def signature(self, module: str, node: ast.AST, depth: int = 0) -> Signature | str:
        """Keyword parameters of a def, or of a class's constructor; a str says why unknown."""
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return _function_signature(node, drop_first=False)
        init = next((s for s in node.body if isinstance(s, ast.FunctionDef)
                     and s.name == "__init__"), None)
        if init is not None:
            return _function_signature(init, drop_first=True)
        own = set()
        if ({_simple_name(d) for d in node.decorator_list} & DATACLASS_DECORATORS
                or {_simple_name(b) for b in node.bases} & FIELD_BASES):
            own = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                   and isinstance(s.target, ast.Name) and _simple_name(s.annotation) != "ClassVar"}
        bases = [b for b in node.bases if _simple_name(b) not in PLAIN_BASES | FIELD_BASES]
        if not bases:
            return Signature(own)
        found = self.definition(module, bases[0].id) if isinstance(bases[0], ast.Name) else None
        if found is None or not isinstance(found[1], ast.ClassDef) or depth > 20:
            return f"base {ast.unparse(bases[0])} not resolved"
        inherited = self.signature(*found, depth + 1)
        if isinstance(inherited, Signature):
            inherited.names |= own
        return inherited


def _function_signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, drop_first: bool) -> Signature:
    positional = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    names = set(positional[len(fn.args.posonlyargs):] + [a.arg for a in fn.args.kwonlyargs])
    if drop_first and positional:
        names.discard(positional[0])
    opaque = any(_simple_name(d) not in KEEP_SIGNATURE for d in fn.decorator_list)
    return Signature(names, fn.args.kwarg is not None, opaque)


def _module_info(body: list[ast.stmt], package: str) -> ModuleInfo:
    info = ModuleInfo()
    _bind_statements(body, package, info, lazy=False)
    if "__getattr__" in info.bindings:
        info.getattr_names = _served_names(info.bindings["__getattr__"].node, info.bindings)
    return info


def _served_names(getattr_fn: ast.AST, bindings: dict[str, Binding]) -> set[str]:
    """Names a module `__getattr__` compares its argument with or looks up in a module dict."""
    served: set[str] = set()
    for node in ast.walk(getattr_fn):
        if isinstance(node, ast.Compare):
            constants = [c for comparator in node.comparators for c in ast.walk(comparator)]
        elif isinstance(node, ast.Name) and node.id in bindings:
            value = getattr(bindings[node.id].node, "value", None)
            constants = value.keys if isinstance(value, ast.Dict) else []
        else:
            continue
        served |= {c.value for c in constants if isinstance(c, ast.Constant)
                   and isinstance(c.value, str)}
    return served


def _bind_statements(body: list[ast.stmt], package: str, info: ModuleInfo, lazy: bool) -> None:
    for stmt in body:
        if isinstance(stmt, ast.If):
            _bind_statements(stmt.body, package, info, lazy or _is_type_checking(stmt.test))
            _bind_statements(stmt.orelse, package, info, lazy)
        elif isinstance(stmt, ast.Try | ast.With):
            blocks = [stmt.body, getattr(stmt, "orelse", []), getattr(stmt, "finalbody", [])]
            for block in blocks + [h.body for h in getattr(stmt, "handlers", [])]:
                _bind_statements(block, package, info, lazy)
        else:
            _bind_statement(stmt, package, info, lazy)


def _bind_statement(stmt: ast.stmt, package: str, info: ModuleInfo, lazy: bool) -> None:
    def bind(name: str, binding: Binding) -> None:
        if not lazy or name not in info.bindings:
            info.bindings[name] = binding

    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        bind(stmt.name, Binding(stmt, lazy))
    elif isinstance(stmt, ast.Assign | ast.AnnAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if stmt.value is not None or lazy:
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        bind(name.id, Binding(stmt, lazy))
            if any(_simple_name(t) == "__all__" for t in targets):
                info.all_names = _string_list(stmt.value)
    elif isinstance(stmt, ast.AugAssign) and _simple_name(stmt.target) == "__all__":
        extra = _string_list(stmt.value)
        info.all_names = None if extra is None or info.all_names is None else info.all_names + extra
    elif isinstance(stmt, ast.Import):
        for alias in stmt.names:
            source = alias.name if alias.asname else alias.name.partition(".")[0]
            bind(alias.asname or source, Binding(stmt, lazy, source))
    elif isinstance(stmt, ast.ImportFrom):
        source = _absolute(stmt.module or "", package, stmt.level)
        for alias in stmt.names:
            if alias.name == "*":
                info.stars.append(source)
            else:
                bind(alias.asname or alias.name, Binding(stmt, lazy, source, alias.name))


# ---------------------------------------------------------------- our package's uses of vLLM
