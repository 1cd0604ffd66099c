"""scripts/check_vllm_compat.py: static checks of our vLLM imports against a vLLM source tree.

Small fake vLLM trees and a fake package exercise every rule (OK and MISSING both); the real
package is checked against the installed vLLM, which must report nothing missing.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from support.scripts import load_script

checker = load_script("scripts/check_vllm_compat.py")

FAKE_VLLM = {
    "__init__.py": """
        from typing import TYPE_CHECKING
        from .version import __version__
        if TYPE_CHECKING:
            from vllm.registry import Registry
        else:
            def __getattr__(name):
                if name == "current_thing":
                    return 1
                raise AttributeError(name)
    """,
    "version.py": "__version__ = version = '9.9.0'\n",
    "registry.py": "class Registry:\n    pass\n",
    "envs.py": """
        import os
        environment_variables = {"VLLM_FOO": lambda: 1}
        def __getattr__(name):
            return environment_variables[name]()
        def helper(a, /, b, *, c=1):
            return a
        @some_wrapper
        def wrapped(a):
            return a
        def flexible(a, **kwargs):
            return a
    """,
    "anything.py": "def __getattr__(name):\n    return name\n",
    "layers/__init__.py": "from .impl import *\nfrom .private import *\n",
    "layers/impl.py": """
        __all__ = ["Linear"]
        __all__ += ["Norm"]
        class Linear:
            def __init__(self, size, bias=False):
                self.size = size
        class Norm(Linear):
            pass
        class Hidden:
            pass
    """,
    "layers/private.py": "class Public:\n    pass\nclass _Private:\n    pass\n",
    "layers/kinds/__init__.py": """
        import enum
        import msgspec
        from dataclasses import dataclass
        class Kind(str, enum.Enum):
            A = "a"
        class Unknown(torch.nn.Module):
            pass
        @dataclass
        class Options:
            depth: int = 1
        class Params(msgspec.Struct, omit_defaults=True):
            task: str | None = None
    """,
}

FAKE_PACKAGE = """
    import vllm.layers.kinds
    import vllm.not_a_module
    from vllm import Registry, current_thing, envs, layers, nothing_here
    from vllm.anything import whatever_it_is
    from vllm.envs import helper, removed, wrapped, flexible
    from vllm.layers import Hidden, Linear, Norm, Public, _Private
    from vllm.layers.kinds import Kind, Options, Params, Unknown

    def lazy():
        from vllm import envs as vllm_envs
        getattr(vllm_envs, "environment_variables", None)
        getattr(vllm_envs, "gone", None)
        hasattr(layers, "absent")
        print(vllm_envs.VLLM_FOO)
        return vllm_envs.required_missing, vllm.layers.kinds.Kind.A, Kind.B, Unknown.anything

    def shadowed(envs):
        return envs.whatever

    def calls():
        helper(1, b=2, c=3, d=4)
        wrapped(a=1, z=2)
        flexible(1, anything=2)
        Linear(8, bias=True, dtype=None)
        Norm(size=1, nope=2)
        Options(depth=2, width=3)
        Params(task="embed", activation=True)
        Unknown(x=1)

    class Sub(Linear):
        def __init__(self):
            super().__init__(size=3, extra=1)

    try:  # one version's place, then the other's
        from vllm.layers.moved import Linear as Moved
    except ImportError:
        from vllm.layers import Public as Moved

    try:
        from vllm.gone_now import Thing
    except (ModuleNotFoundError, AttributeError):
        from vllm.gone_too import Thing
"""


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


@pytest.fixture
def fake(tmp_path):
    """(vLLM SourceTree, package dir) of the fake tree and the fake package using it."""
    tree = checker.SourceTree(write_tree(tmp_path / "tree" / "vllm", FAKE_VLLM))
    package = write_tree(tmp_path / "pkg" / "fakepkg", {"mod.py": FAKE_PACKAGE})
    return tree, package


def statuses(findings) -> dict[tuple[str, str], str]:
    return {(f.owner, f.name): f.status for f in findings}


@pytest.mark.parametrize(("owner", "name", "status"), [
    ("vllm.layers", "kinds", "OK"),  # submodule reached through `import vllm.layers.kinds`
    ("vllm.layers.kinds", "(module)", "OK"),
    ("vllm.not_a_module", "(module)", "MISSING"),
    ("vllm", "Registry", "OK"),  # TYPE_CHECKING import served by __getattr__
    ("vllm", "current_thing", "OK"),  # compared with the name inside __getattr__
    ("vllm", "nothing_here", "MISSING"),  # __getattr__ declares what it serves
    ("vllm.anything", "whatever_it_is", "UNCHECKED"),  # a __getattr__ that may serve anything
    ("vllm", "envs", "OK"),
    ("vllm.envs", "helper", "OK"),
    ("vllm.envs", "removed", "MISSING"),
    ("vllm.layers", "Linear", "OK"),  # star import, listed in __all__
    ("vllm.layers", "Norm", "OK"),  # added by `__all__ +=`
    ("vllm.layers", "Hidden", "MISSING"),  # defined in impl but not in its __all__
    ("vllm.layers", "Public", "OK"),  # star import of a module without __all__
    ("vllm.layers", "_Private", "MISSING"),  # underscore names are not star-exported
    ("vllm.envs", "environment_variables", "OK"),
    ("vllm.envs", "gone", "OPTIONAL-MISSING"),
    ("vllm.layers", "absent", "OPTIONAL-MISSING"),
    ("vllm.envs", "VLLM_FOO", "OK"),  # a key of the dict __getattr__ reads
    ("vllm.envs", "required_missing", "MISSING"),
    ("vllm.layers.kinds.Kind", "A", "OK"),
    ("vllm.layers.kinds.Kind", "B", "MISSING"),
    ("vllm.layers.kinds.Unknown", "anything", "UNCHECKED"),
    # try/except ImportError: one alternative resolves, so the other may be missing ...
    ("vllm.layers.moved", "Linear", "OPTIONAL-MISSING"),
    # ... but when none does, each is missing
    ("vllm.gone_now", "Thing", "MISSING"),
    ("vllm.gone_too", "Thing", "MISSING"),
])
def test_name_findings(fake, owner, name, status):
    tree, package = fake
    names, _ = checker.check(tree, checker.collect_uses([package]))
    assert statuses(names)[(owner, name)] == status


def test_a_parameter_shadowing_a_vllm_module_is_not_checked(fake):
    tree, package = fake
    names, _ = checker.check(tree, checker.collect_uses([package]))
    assert ("vllm.envs", "helper") in statuses(names)
    assert "whatever" not in {name for _, name in statuses(names)}


def test_uses_record_file_and_line(fake):
    _, package = fake
    uses = checker.collect_uses([package])
    lazy = next(u for u in uses if u.chain == ("environment_variables",))
    assert (lazy.module, lazy.name, lazy.optional) == ("vllm", "envs", True)
    line = textwrap.dedent(FAKE_PACKAGE).splitlines().index(
        '    getattr(vllm_envs, "environment_variables", None)'
    )
    assert lazy.where == f"fakepkg/mod.py:{line + 1}"


@pytest.mark.parametrize(("callee", "keyword", "status"), [
    ("vllm.envs.helper", "b", "OK"),
    ("vllm.envs.helper", "c", "OK"),
    ("vllm.envs.helper", "d", "MISSING"),
    ("vllm.envs.wrapped", "a", "OK"),
    ("vllm.envs.wrapped", "z", "UNCHECKED"),  # an unknown decorator may change the signature
    ("vllm.envs.flexible", "anything", "OK"),  # **kwargs
    ("vllm.layers.Linear", "bias", "OK"),
    ("vllm.layers.Linear", "dtype", "MISSING"),
    ("vllm.layers.Norm", "size", "OK"),  # __init__ inherited from Linear
    ("vllm.layers.Norm", "nope", "MISSING"),
    ("vllm.layers.kinds.Options", "depth", "OK"),  # dataclass field
    ("vllm.layers.kinds.Options", "width", "MISSING"),
    ("vllm.layers.kinds.Params", "task", "OK"),  # msgspec.Struct field
    ("vllm.layers.kinds.Params", "activation", "MISSING"),
    ("vllm.layers.kinds.Unknown", "x", "UNCHECKED"),  # base class outside the tree
    ("vllm.layers.Linear", "size", "OK"),  # super().__init__ in a subclass
    ("vllm.layers.Linear", "extra", "MISSING"),
])
def test_keyword_findings(fake, callee, keyword, status):
    tree, package = fake
    _, keywords = checker.check(tree, checker.collect_uses([package]))
    assert statuses(keywords)[(callee, keyword)] == status


def test_main_fails_on_missing_names_and_prints_json(fake, capsys, monkeypatch):
    tree, package = fake
    monkeypatch.setattr(checker, "PACKAGE_DIR", package)
    assert checker.main([str(tree.root), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["version"] == "9.9.0"
    assert result["ok"] is False
    assert result["counts"]["names"]["MISSING"] == 9
    assert result["counts"]["keywords"]["MISSING"] == 6


def test_table_ends_with_summary(fake, capsys, monkeypatch):
    tree, package = fake
    monkeypatch.setattr(checker, "PACKAGE_DIR", package)
    checker.main([str(tree.root / "vllm")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["module", "name", "status", "detail", "used", "at"]
    assert lines[-1].startswith("vLLM 9.9.0 at ") and lines[-1].endswith(": FAIL")


def test_rejects_a_directory_without_vllm(tmp_path):
    with pytest.raises(ValueError, match="path"):
        checker.SourceTree(tmp_path)


def test_package_matches_installed_vllm(capsys):
    installed = checker.installed_vllm()
    assert (installed / "__init__.py").is_file()
    uses = checker.collect_uses([checker.PACKAGE_DIR])
    result = checker.report(checker.SourceTree(installed), uses)
    # Only the other version's side of a version difference may be absent: a try/except
    # ImportError pair, or an optional lookup in compat.py (where version differences live).
    other_version = [f for f in result["names"] if f["status"] == "OPTIONAL-MISSING" and (
        f["how"].endswith("an alternative import resolves")
        or all(where.startswith("vllm_npu_ext/compat.py:") for where in f["where"]))]  # fmt: skip
    missing = [f for f in result["names"] + result["keywords"]
               if f["status"] != "OK" and f not in other_version]  # fmt: skip
    assert missing == []
    assert result["ok"] and result["counts"]["names"]["OK"] > 30
    assert result["counts"]["keywords"]["OK"] > 10
    assert checker.main([]) == 0
    assert capsys.readouterr().out.rstrip().endswith(": PASS")
