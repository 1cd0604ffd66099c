"""Sources are cited by version and name, never by line number.

A comment or docstring of the package that cites another package's source says which version
and which function, class, method or named constant (e.g. vllm-ascend 0.23.0.post1
`AscendAttentionCPImpl.update_graph_params`), since line numbers move with every release and
cannot be checked. This test fails on any `file.py:123` (or `file.cpp:10-20`, or a backquoted
`` `file.py`:123 ``) in a text file under `vllm_npu_ext/`, listing each place; URLs and
`module:function` names (no digits) are not citations.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_npu_ext"
TEXT_SUFFIXES = frozenset({
    ".py", ".pyi", ".cpp", ".cc", ".c", ".h", ".hpp", ".md", ".rst", ".txt", ".toml", ".cfg",
    ".ini", ".yaml", ".yml", ".json", ".cmake", ".sh",
})  # fmt: skip
SOURCE_SUFFIXES = r"py|pyi|cpp|cc|c|h|hpp|md|rst|txt|ya?ml|json|toml|cmake|sh"
# A file name, an optional closing backquote, a colon and a line number (or range).
LINE_CITATION = re.compile(rf"[\w./（）-]+\.(?:{SOURCE_SUFFIXES})`?:\d+")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")


def line_citations(text: str) -> list[str]:
    """The line-number citations in `text`, URLs left out."""
    return [
        m.group(0) for line in text.splitlines() for m in LINE_CITATION.finditer(URL.sub("", line))
    ]


def package_text_files() -> list[Path]:
    return sorted(
        path for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
        and (path.suffix in TEXT_SUFFIXES or path.name == "CMakeLists.txt")
    )  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        "(`attention/context_parallel/attention_cp.py:383-389`)",
        "vllm-ascend's platform.py:533 sets it",
        "(the wheel's `_op_plugin_docs.py`:1238-1255)",
        "# PagedCacheLoadAtb.cpp:77-87: one operator",
        "see https://example.org/a.py and model_runner_v1.py:2737",
    ],
)
def test_a_line_number_citation_is_found(text: str) -> None:
    assert line_citations(text), text


@pytest.mark.parametrize(
    "text",
    [
        "vllm-ascend 0.23.0.post1 `AscendAttentionCPImpl.update_graph_params`",
        "pinned as `vllm_ascend.worker.model_runner_v1:NPUModelRunner._prepare_inputs`",
        "https://github.com/vllm-project/vllm/blob/v0.23.0/vllm/config.py#L120",
        "http://127.0.0.1:8000/v1/embeddings",
        'origin = f"{f.filename}:{f.lineno} {f.name}"',
        "Python 3.11: the 3.11 wheel",
    ],
)
def test_a_name_or_url_is_not_a_citation(text: str) -> None:
    assert not line_citations(text), text


def test_the_package_cites_no_line_numbers() -> None:
    files = package_text_files()
    assert any(path.name == "__init__.py" for path in files)  # the scan reads the package
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {citation}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for citation in line_citations(line)
    ]
    assert not found, (
        "cite other packages' sources by version and function (class, method or named "
        "constant), not by line number:\n" + "\n".join(found)
    )
