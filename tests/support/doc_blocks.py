"""The project's Markdown pages as data: fenced blocks with their markers, links and anchors.

A fenced block is tested according to the HTML comment on the line before it (the nearest
non-blank line), which names its kind and options:

    <!-- doc: run -->                               run it for real
    <!-- doc: run expect="out.strip() == 'x'" -->   ... and check its stdout
    <!-- doc: server=embedding expect="..." -->     run it against the suite's shared server
    <!-- doc: dry-run -->                           check every command without running it
    <!-- doc: console tmp=/tmp/demo -->             run a `$ ` transcript, compare the output
    <!-- doc: output -->                            example output (text and console only)

`tests/test_docs.py` does the checking; `docs/development.md` describes it for readers.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

KINDS = ("run", "dry-run", "server", "console", "output")
SERVERS = ("embedding", "reranker")
OPTIONS = {"expect", "tmp"}
SHELL_LANGUAGES = ("bash", "sh", "shell")
RUNNABLE_LANGUAGES = (*SHELL_LANGUAGES, "python")
OUTPUT_LANGUAGES = ("", "text", "console", "json")

_MARKER = re.compile(r"^\s*<!--\s*doc:(.*?)-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<language>[\w+-]*)\s*$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"`[^`]*`")


def doc_files() -> list[Path]:
    """README.md and every page under docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


@dataclasses.dataclass(frozen=True)
class Marker:
    """A parsed `<!-- doc: ... -->` comment."""

    kind: str
    server: str | None = None
    expect: str | None = None
    tmp: str | None = None


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text (dedented) and its marker."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    marker: Marker | None
    marker_error: str | None = None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str | None:
        return self.marker.kind if self.marker else None

    @property
    def is_shell(self) -> bool:
        return self.language in SHELL_LANGUAGES


def parse_marker(text: str) -> Marker:
    """`run`, `server=embedding expect="..."`, ... -> Marker; ValueError naming what is wrong."""
    words = shlex.split(text)
    if not words:
        raise ValueError("empty doc marker")
    kind, _, server = words[0].partition("=")
    if kind not in KINDS:
        raise ValueError(f"doc marker kind must be one of {KINDS}, got {words[0]!r}")
    if (kind == "server") != bool(server) or (server and server not in SERVERS):
        raise ValueError(f"a server marker names one of {SERVERS} (server=NAME), got {words[0]!r}")
    options = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep or key not in OPTIONS:
            raise ValueError(f"doc marker options are {sorted(OPTIONS)} as key=value, got {word!r}")
        options[key] = value
    return Marker(kind=kind, server=server or None, **options)


def _marker_before(lines: list[str], index: int) -> tuple[Marker | None, str | None]:
    """The marker on the nearest non-blank line before `lines[index]`, or (None, None)."""
    for previous in reversed(lines[:index]):
        if not previous.strip():
            continue
        match = _MARKER.match(previous)
        if match is None:
            return None, None
        try:
            return parse_marker(match.group(1)), None
        except ValueError as error:
            return None, str(error)
    return None, None


def _closes(line: str, fence: str) -> bool:
    """Whether `line` closes a block opened by `fence` (same character, at least as many)."""
    return re.match(rf"^\s*{fence[0]}{{{len(fence)},}}\s*$", line) is not None


def _dedent(line: str, indent: str) -> str:
    return line[len(indent) :] if line.startswith(indent) else line.lstrip()


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening["fence"], opening["indent"]
        end = index + 1
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        marker, error = _marker_before(lines, index)
        body = "\n".join(_dedent(line, indent) for line in lines[index + 1 : end])
        found.append(Block(path, index + 1, opening["language"], body + "\n", marker, error))
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks(path)]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line outside fenced blocks."""
    result, fence = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        opening = _FENCE.match(line)
        if fence is None and opening is not None:
            fence = opening["fence"]
        elif fence is not None and _closes(line, fence):
            fence = None
        elif fence is None:
            result.append((number, line))
    return result


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = _CODE_SPAN.sub(lambda span: span.group(0)[1:-1], heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a file, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: Counter[str] = Counter()
    result = set()
    for _, line in prose_lines(path):
        match = _HEADING.match(line)
        if match is None:
            continue
        slug = github_slug(match.group(2))
        result.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return result


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link outside code, external ones excluded."""
    found = []
    for number, line in prose_lines(path):
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                found.append((number, target))
    return found


def broken_link(path: Path, target: str) -> str | None:
    """Why a relative link or #anchor of `path` does not resolve, or None."""
    file_part, _, anchor = target.partition("#")
    linked = (path.parent / file_part).resolve() if file_part else path
    if not linked.exists():
        return f"{target}: {linked} does not exist"
    if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
        return f"{target}: no heading with anchor #{anchor} in {linked.name}"
    return None
