#!/usr/bin/env python
"""Check, from vllm-ascend's sources, what the CP merge patch assumes and no run can show.

The patch (vllm_npu_ext/patches/vllm_ascend_cp/) replaces `common_cp`'s merge functions in the
modules that call them. Most of what it assumes is now seen running, with vllm-ascend
0.23.0.post1 installed in .venv-ascend (tests/with_vllm_ascend): the installed version, the
targets' parameters (`target_problem` on the real `common_cp`), that the originals do what
the replacements do (vllm-ascend's own pair against ours and an exact merge, in gloo ranks),
that both callers are patched on import, and that vllm-ascend's runner and attention backend
do not import the callers without CP. What a run cannot show is checked here, with `ast`:

- every caller module uses the pair only as `_npu_attention_update(D,
  _process_attn_out_lse(out, lse))` (a replaced half fed by an unreplaced one would be
  silently wrong on a path the tests do not take);
- no other module of vllm-ascend uses the targets;
- no module imports a caller module at import time (every module, not only those a run loads).

    python scripts/check_vllm_ascend_patch.py PATH      # sdist .tar.gz or unpacked directory
    python scripts/check_vllm_ascend_patch.py --download [--dest DIR]

`--download` fetches the sdist named in the PyPI simple index (pip cannot build its
metadata without torch-npu) and verifies its pinned sha256. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

from vllm_npu_ext.patches import PATCHES, pins
from vllm_npu_ext.patches.vllm_ascend_cp import TESTED_VERSION
from vllm_npu_ext.patches.vllm_ascend_cp.patching import (
    CALLER_MODULES,
    COMMON_MODULE,
    PAIR,
    TARGET_SIGNATURES,
)

SIMPLE_INDEX = "https://pypi.org/simple/vllm-ascend/"
SDIST_NAME = f"vllm_ascend-{TESTED_VERSION}.tar.gz"
# The sdist this project was checked against (PyPI's published sha256): a different file under
# the same name is refused, whatever the index says.
SDIST_SHA256 = "a3b9f4a5dd7aa50c37e03d1f35937c4ae5aeacc49b734cac74d59ce5757738e1"
PROCESS, UPDATE = PAIR


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


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def download_sdist(dest: Path) -> Path:
    """Fetch SDIST_NAME from the PyPI simple index into dest; verify it against SDIST_SHA256.

    An sdist already in dest with the pinned sha256 is used as it is."""
    target = dest / SDIST_NAME
    if target.is_file() and sha256_of(target) == SDIST_SHA256:
        return target
    with urllib.request.urlopen(SIMPLE_INDEX, timeout=60) as response:
        index = response.read().decode("utf-8")
    match = re.search(rf'href="([^"]*/{re.escape(SDIST_NAME)})#sha256=([0-9a-f]+)"', index)
    if match is None:
        raise SystemExit(f"{SDIST_NAME} is not listed in {SIMPLE_INDEX}")
    url, sha256 = match.groups()
    if sha256 != SDIST_SHA256:
        raise SystemExit(
            f"{SIMPLE_INDEX} lists {SDIST_NAME} with sha256 {sha256}, pinned {SDIST_SHA256}"
        )
    dest.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=300) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != SDIST_SHA256:
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
    """Each caller imports the decode pair and uses it only as a pair."""
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
        missing = set(PAIR) - imported
        results[f"{module} imports the pair"] = f"no {sorted(missing)}" if missing else None
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


def check_pins(sources: dict[str, str]) -> dict[str, str | None]:
    """Every vllm-ascend function the patch table pins has a pinned source here."""
    changed = []
    for patch in PATCHES.values():
        for target, versions in patch.pins.items():
            module, _, qualname = target.partition(":")
            if module.startswith("vllm_ascend."):
                text = sources.get(module_path(module), "")
                if pins.source_hash_in_module(text, qualname) not in versions.values():
                    changed.append(f"{target} ({patch.name})")
    return {"pinned sources match (patches/__init__.py)": ", ".join(changed) or None}


def run_checks(sources: dict[str, str]) -> dict[str, str | None]:
    """Every check; value None = passed, else what was wrong."""
    return {**check_callers(sources), **check_rest_of_package(sources), **check_pins(sources)}


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
