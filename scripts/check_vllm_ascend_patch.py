#!/usr/bin/env python
"""Check the CP merge patch (vllm_npu_ext/patches/vllm_ascend_cp.py) against vllm-ascend's sources.

vllm-ascend cannot be imported here (it needs torch_npu and CANN), so its sdist is read as
text and parsed with `ast`:

    python scripts/check_vllm_ascend_patch.py PATH      # sdist .tar.gz or unpacked directory
    python scripts/check_vllm_ascend_patch.py --download [--dest DIR]

`--download` fetches the sdist named in the PyPI simple index (pip cannot build its
metadata without torch-npu) and verifies its sha256. Checked: the sdist's version; both
targets exist in common_cp with the parameters the patch expects (and the replacements
take the same); the originals still do what the patch replaces (TensorList
npu_attention_update after unbind; all_to_all and PCP all-gather); every caller module
imports both and uses them only as the pair `_npu_attention_update(D,
_process_attn_out_lse(out, lse))`; no other module uses them; no module imports a caller
module at import time (they load only when CP is enabled). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import inspect
import json
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

from vllm_npu_ext.patches.vllm_ascend_cp import (
    CALLER_MODULES,
    COMMON_MODULE,
    REPLACEMENTS,
    TARGET_SIGNATURES,
    TESTED_VERSION,
)

SIMPLE_INDEX = "https://pypi.org/simple/vllm-ascend/"
SDIST_NAME = f"vllm_ascend-{TESTED_VERSION}.tar.gz"
PROCESS, UPDATE = "_process_attn_out_lse", "_npu_attention_update"


def module_path(module: str) -> str:
    """`a.b.c` -> `a/b/c.py`, the key of `read_sources`."""
    return module.replace(".", "/") + ".py"


def read_sources(path: Path) -> dict[str, str]:
    """Every `vllm_ascend/**/*.py` and PKG-INFO of an sdist (tarball or unpacked dir)."""
    wanted = re.compile(r"(?:^|/)(vllm_ascend/.*\.py|PKG-INFO)$")
    sources: dict[str, str] = {}
    if path.is_dir():
        for file in sorted(path.rglob("*")):
            match = wanted.search(file.relative_to(path).as_posix())
            if match and file.is_file():
                sources.setdefault(match.group(1), file.read_text(encoding="utf-8"))
        return sources
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            match = wanted.search(member.name)
            if match and member.isfile():
                text = tar.extractfile(member).read().decode("utf-8")
                sources.setdefault(match.group(1), text)
    return sources


def download_sdist(dest: Path) -> Path:
    """Fetch SDIST_NAME from the PyPI simple index into dest; verify its sha256."""
    with urllib.request.urlopen(SIMPLE_INDEX, timeout=60) as response:
        index = response.read().decode("utf-8")
    match = re.search(rf'href="([^"]*/{re.escape(SDIST_NAME)})#sha256=([0-9a-f]+)"', index)
    if match is None:
        raise SystemExit(f"{SDIST_NAME} is not listed in {SIMPLE_INDEX}")
    url, sha256 = match.groups()
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / SDIST_NAME
    with urllib.request.urlopen(url, timeout=300) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"sha256 mismatch for {url}")
    target.write_bytes(data)
    return target


def find_function(source: str, name: str) -> ast.FunctionDef | None:
    """The module-level function `name` in source, or None."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def function_source(sources: dict[str, str], module: str, name: str) -> str:
    """Source text of a module-level function of vllm-ascend (for tests that run it)."""
    text = sources[module_path(module)]
    node = find_function(text, name)
    if node is None:
        raise LookupError(f"{module}.{name} not found")
    return ast.get_source_segment(text, node)


def _called_names(node: ast.AST) -> set[str]:
    """Names and attribute names called anywhere inside node."""
    names = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def check_common(sources: dict[str, str]) -> dict[str, str | None]:
    """Targets' existence, parameters and algorithm; None means passed."""
    text = sources.get(module_path(COMMON_MODULE))
    if text is None:
        return {"common_cp": f"{module_path(COMMON_MODULE)} missing"}
    results: dict[str, str | None] = {}
    needs = {
        PROCESS: {"cat", "all_to_all_single", "all_gather"},
        UPDATE: {"unbind", "npu_attention_update"},
    }
    for name, params in TARGET_SIGNATURES.items():
        node = find_function(text, name)
        if node is None:
            results[f"{name} exists"] = "missing"
            continue
        found = tuple(arg.arg for arg in node.args.args)
        results[f"{name} signature {params}"] = None if found == params else f"found {found}"
        ours = tuple(inspect.signature(REPLACEMENTS[name]).parameters)
        results[f"replacement for {name} takes {params}"] = None if ours == params else str(ours)
        missing = needs[name] - _called_names(node)
        problem = f"no {sorted(missing)}" if missing else None
        results[f"{name} calls {sorted(needs[name])}"] = problem
    return results


def _calls(node: ast.AST, name: str) -> bool:
    """Whether node is a call of the plain name `name`."""
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == name


def _pair_problems(function: ast.FunctionDef) -> tuple[int, list[str]]:
    """(pairs found, problems) for the PROCESS/UPDATE uses inside one function."""
    produced, problems, pairs = {}, [], 0
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and _calls(node.value, PROCESS):
            produced.update({t.id: node.lineno for t in node.targets if isinstance(t, ast.Name)})
    loads = [n.id for n in ast.walk(function) if isinstance(n, ast.Name) and n.id in produced]
    for node in ast.walk(function):
        if _calls(node, UPDATE):
            arg = node.args[1] if len(node.args) == 2 else None
            # the name is stored once (the assignment) and loaded once (this call)
            if isinstance(arg, ast.Name) and arg.id in produced and loads.count(arg.id) == 2:
                pairs += 1
            else:
                problems.append(f"line {node.lineno}: {UPDATE} not fed only by {PROCESS}")
    if len(produced) != pairs:
        problems.append(f"{function.name}: {len(produced)} {PROCESS} results, {pairs} pairs")
    return pairs, problems


def check_callers(sources: dict[str, str]) -> dict[str, str | None]:
    """Each caller imports both targets and uses them only as a pair."""
    results: dict[str, str | None] = {}
    for module in CALLER_MODULES:
        text = sources.get(module_path(module))
        if text is None:
            results[f"{module} exists"] = "missing"
            continue
        tree = ast.parse(text)
        imported = {
            alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module == COMMON_MODULE
            for alias in node.names
        }
        missing = set(TARGET_SIGNATURES) - imported
        results[f"{module} imports both targets"] = f"no {sorted(missing)}" if missing else None
        pairs, problems = 0, []
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                found, issues = _pair_problems(node)
                pairs, problems = pairs + found, problems + issues
        results[f"{module} uses them only as pairs ({pairs} found)"] = (
            "; ".join(problems) if problems or not pairs else None
        )
    return results


def _mentions(tree: ast.AST, names: set[str]) -> bool:
    """Whether any name, attribute or imported alias in tree is one of names."""
    for node in ast.walk(tree):
        found = getattr(node, "id", None) or getattr(node, "attr", None)
        if found in names or (isinstance(node, ast.alias) and node.name in names):
            return True
    return False


def _imported_modules(node: ast.AST) -> set[str]:
    """Modules an import statement may bind: `a.b` and, for `from a import b`, also `a.b`."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.module:
        return {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return set()


def check_rest_of_package(sources: dict[str, str]) -> dict[str, str | None]:
    """No other module uses the targets; nobody imports a caller module at import time."""
    ours = {module_path(m) for m in (COMMON_MODULE, *CALLER_MODULES)}
    keywords = [*TARGET_SIGNATURES, *(m.rsplit(".", 1)[1] for m in CALLER_MODULES)]
    users, eager = [], []
    for path, text in sources.items():
        if path in ours or not path.endswith(".py") or not any(k in text for k in keywords):
            continue  # the text test only spares parsing files that cannot match
        tree = ast.parse(text)
        if _mentions(tree, set(TARGET_SIGNATURES)):
            users.append(path)
        eager += [
            f"{path}:{node.lineno}"
            for node in tree.body
            if _imported_modules(node) & set(CALLER_MODULES)
        ]
    return {
        "no other module uses the targets": ", ".join(users) or None,
        "caller modules imported lazily only": ", ".join(eager) or None,
    }


def check_version(sources: dict[str, str]) -> dict[str, str | None]:
    match = re.search(r"^Version: (\S+)", sources.get("PKG-INFO", ""), re.MULTILINE)
    found = match.group(1) if match else "unknown"
    return {f"sdist version {TESTED_VERSION}": None if found == TESTED_VERSION else found}


def run_checks(sources: dict[str, str]) -> dict[str, str | None]:
    """Every check; value None = passed, else what was wrong."""
    return {
        **check_version(sources),
        **check_common(sources),
        **check_callers(sources),
        **check_rest_of_package(sources),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdist", nargs="?", type=Path, help="sdist .tar.gz or unpacked dir")
    parser.add_argument("--download", action="store_true", help="fetch the sdist from PyPI")
    parser.add_argument("--dest", type=Path, default=Path("build/sdist"), help="download dir")
    args = parser.parse_args(argv)
    if args.download:
        args.sdist = download_sdist(args.dest)
    if args.sdist is None:
        parser.error("give the sdist path or --download")
    results = run_checks(read_sources(args.sdist))
    for name, problem in results.items():
        print(f"PASS {name}" if problem is None else f"FAIL {name}: {problem}")
    failed = {name: problem for name, problem in results.items() if problem is not None}
    summary = {"sdist": str(args.sdist), "ok": not failed, "checks": len(results), "failed": failed}
    print(json.dumps(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
