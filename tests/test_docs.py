"""The documentation cannot drift from the code: README.md and docs/*.md are tested.

Every fenced block carries a `<!-- doc: KIND -->` marker (tests/support/doc_blocks.py) and is
tested by its kind: `run` blocks run for real, `server` blocks run against the suite's shared
embedding or reranker server (tests/conftest.py; none is started here that the suite does not
start anyway), `dry-run` blocks have every command checked without running it (vLLM server
command lines by vLLM's own argument parser), `console` transcripts are run and their output
compared. Relative links and anchors must resolve, repository paths named in the prose must
exist, and the environment page must agree with `vllm_npu_ext/envs.py`.
"""

from __future__ import annotations

import functools
import json
import re

import httpx
import pytest
from support import doc_commands
from support.doc_blocks import (
    OUTPUT_LANGUAGES,
    README,
    ROOT,
    RUNNABLE_LANGUAGES,
    SHELL_LANGUAGES,
    Block,
    all_blocks,
    broken_link,
    doc_files,
    links,
    prose_lines,
)

from vllm_npu_ext import envs
from vllm_npu_ext.tiny_model import DEFAULT_MODEL_NAME, DEFAULT_RERANKER_NAME

BLOCKS = all_blocks()
DOCUMENTED_ADDRESS = "127.0.0.1:8000"
DOCUMENTED_MODELS = {"embedding": DEFAULT_MODEL_NAME, "reranker": DEFAULT_RERANKER_NAME}
README_MAX_LINES = 200
# Paths of this repository in the prose (`path` or `path:line`); build outputs need not exist.
REPOSITORY_PATH = re.compile(r"`((?:vllm_npu_ext|benchmarks|scripts|requirements|tests)/[^`\s:]*)")
BUILD_OUTPUTS = ("vllm_npu_ext/cann_ops/_opp", "vllm_npu_ext/_cann_C")
VARIABLE = re.compile(r"VLLM_NPU_EXT_[A-Z0-9_]*")
ENVIRONMENT_PAGE = ROOT / "docs" / "environment.md"
# Checked with the documented commands: the checks must tell the good from the misspelt.
GOOD_SERVE = ["vllm-npu-ext", "serve", "MODEL", "--max-model-len", "8192"]
MISSPELT_SERVE = ["vllm-npu-ext", "serve", "MODEL", "--max-model-lenn", "8192"]
GOOD_SCRIPT = ["python", "benchmarks/bench_cp_merge.py", "--repeats", "1"]
MISSPELT_SCRIPT = ["python", "benchmarks/bench_cp_merge.py", "--repeatz", "1"]
# A checkpoint path a reader fills in (`/path/to/NAME`) is checked as an existing directory.
PLACEHOLDER_SERVE = ["vllm-npu-ext", "serve", "/path/to/Qwen3-8B", "--runner", "generate"]
CANARIES = (GOOD_SERVE, MISSPELT_SERVE, GOOD_SCRIPT, MISSPELT_SCRIPT, PLACEHOLDER_SERVE)


def select(kind: str, languages: tuple[str, ...] = RUNNABLE_LANGUAGES) -> list[Block]:
    return [b for b in BLOCKS if b.kind == kind and b.language in languages]


def blocks_of(kind: str, languages: tuple[str, ...] = RUNNABLE_LANGUAGES) -> list:
    return [pytest.param(b, id=b.name) for b in select(kind, languages)]


def marker_problem(block: Block) -> str | None:
    """Why a block's marker does not say how to test it, or None."""
    if block.marker_error or block.marker is None:
        return block.marker_error or "no <!-- doc: KIND --> marker on the line before it"
    kind, language = block.kind, block.language
    if kind == "output" and language not in OUTPUT_LANGUAGES:
        return f"a {language} block is run or dry-run, not `output`"
    if kind == "console" and language != "console":
        return "a console marker needs a ```console block"
    if kind in ("run", "dry-run", "server") and language not in RUNNABLE_LANGUAGES:
        return f"`{kind}` needs a bash or python block, not {language or 'plain'!r}"
    if kind == "server" and not block.marker.expect:
        return 'a server block says what it answers: expect="..."'
    if kind == "dry-run" and block.marker.expect:
        return "a dry-run block has no output to expect"
    return None


def test_every_block_says_how_it_is_tested():
    problems = [f"{b.name}: {p}" for b in BLOCKS if (p := marker_problem(b))]
    assert not problems, "\n".join(problems)


def test_readme_is_a_users_page_of_at_most_200_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_starts_with_the_two_fresh_machine_commands():
    first = next(b for b in BLOCKS if b.path == README)
    commands = [line.split("#")[0].strip() for line in first.text.splitlines()]
    assert commands == ["make serve", "make test"], first.text
    assert first.kind == "dry-run"


def test_readme_links_every_docs_page():
    linked = {(README.parent / target.partition("#")[0]).resolve() for _, target in links(README)}
    unlinked = [p.name for p in doc_files()[1:] if p.resolve() not in linked]
    assert not unlinked, f"README.md's docs index lacks {unlinked}"


@pytest.mark.parametrize("page", doc_files()[1:], ids=lambda p: p.name)
def test_docs_page_opens_with_whom_it_is_for(page):
    lines = [line for _, line in prose_lines(page) if line.strip()]
    assert lines[0].startswith("# ") and lines[1].startswith("For "), lines[:2]


def test_relative_links_and_anchors_resolve():
    problems = [f"{path.relative_to(ROOT)}:{line}: {problem}"
                for path in doc_files() for line, target in links(path)
                if (problem := broken_link(path, target))]  # fmt: skip
    assert not problems, "\n".join(problems)


def test_repository_paths_named_in_the_docs_exist():
    problems = []
    for path in doc_files():
        for line, text in prose_lines(path):
            for named in REPOSITORY_PATH.findall(text):
                named = named.rstrip(".,;)")
                if not named.startswith(BUILD_OUTPUTS) and not (ROOT / named).exists():
                    problems.append(f"{path.relative_to(ROOT)}:{line}: {named}")
    assert not problems, "no such file:\n" + "\n".join(problems)


def test_every_variable_named_in_the_docs_is_one_the_package_reads():
    unknown = set()
    for path in doc_files():
        for name in VARIABLE.findall(path.read_text(encoding="utf-8")):
            known = (any(v.startswith(name) for v in envs.VARIABLES) if name.endswith("_")
                     else name in envs.VARIABLES)  # fmt: skip
            if not known:
                unknown.add(f"{path.name}: {name}")
    assert not unknown, sorted(unknown)


def test_environment_page_documents_every_variable():
    page = ENVIRONMENT_PAGE.read_text(encoding="utf-8")
    fusion_prefix = "VLLM_NPU_EXT_FUSE_"
    missing = [name for name in envs.VARIABLES
               if f"`{name}`" not in page
               and not (name.startswith(fusion_prefix)
                        and f"`{name.removeprefix(fusion_prefix)}`" in page)]  # fmt: skip
    assert not missing, f"docs/environment.md does not document {missing}"


# --- run, console and server blocks ----------------------------------------------------------


def expectation_holds(block: Block, names: dict) -> None:
    expect = block.marker.expect
    if expect:
        assert eval(expect, {}, names), f"{block.name}: expected {expect}, got {names.get('out')!r}"


@pytest.mark.parametrize("block", blocks_of("run"))
def test_run_block_succeeds_as_documented(block, tmp_path):
    run = doc_commands.run_shell if block.is_shell else doc_commands.run_python
    result = run(block.text, tmp_path)
    assert result.returncode == 0, doc_commands.failure(result, block.name)
    expectation_holds(block, {"out": result.stdout})


@pytest.mark.parametrize("block", blocks_of("console", ("console",)))
def test_console_block_prints_what_it_shows(block, tmp_path):
    problem = doc_commands.console_problem(block.text, tmp_path, block.marker.tmp)
    assert problem is None, f"{block.name}:\n{problem}"


def served_text(block: Block, server) -> str:
    """The block with the documented address and model name replaced by the fixture's."""
    models = httpx.get(server.base_url + "/v1/models", timeout=30).json()["data"]
    name = re.escape(DOCUMENTED_MODELS[block.marker.server])
    text = re.sub(rf"(?<![\w-]){name}(?![\w-])", models[0]["id"], block.text)
    return text.replace(DOCUMENTED_ADDRESS, server.base_url.removeprefix("http://"))


def json_documents(text: str) -> list:
    decoder, documents, index = json.JSONDecoder(), [], 0
    while (index := len(text) - len(text[index:].lstrip())) < len(text):
        document, index = decoder.raw_decode(text, index)
        documents.append(document)
    return documents


@pytest.mark.parametrize("block", blocks_of("server"))
def test_server_block_answers_as_documented(block, request, tmp_path):
    server = request.getfixturevalue(f"{block.marker.server}_server")
    earlier = [b for b in BLOCKS if b.path == block.path and b.line < block.line
               and b.kind == "server" and b.language == block.language == "python"]  # fmt: skip
    assert any(DOCUMENTED_ADDRESS in b.text for b in [*earlier, block]), (
        f"{block.name} does not talk to {DOCUMENTED_ADDRESS}")  # fmt: skip
    if block.is_shell:
        result = doc_commands.run_shell(served_text(block, server), tmp_path)
        assert result.returncode == 0, doc_commands.failure(result, block.name)
        outs = json_documents(result.stdout)
        assert outs and not any("error" in o for o in outs if isinstance(o, dict)), result.stdout
        expectation_holds(block, {"out": outs[0], "outs": outs})
        return
    names: dict = {}
    for each in [*earlier, block]:  # a page's python blocks build on each other, in order
        exec(compile(served_text(each, server), each.name, "exec"), names)
    expectation_holds(block, names)


# --- dry-run blocks --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """Every dry-run shell block's recorded commands, the child-process checks of all of them
    (and of the canaries) done at once, and the canaries' scratch directory."""
    recorded = {}
    for block in select("dry-run", SHELL_LANGUAGES):
        scratch = tmp_path_factory.mktemp("dry_run")
        recorded[block.name] = (scratch, *doc_commands.record_commands(block.text, scratch))
    commands = [doc_commands.with_placeholders(argv, scratch)
                for scratch, calls, _ in recorded.values() for argv in calls]  # fmt: skip
    canary_scratch = tmp_path_factory.mktemp("canaries")
    commands += [doc_commands.with_placeholders(argv, canary_scratch) for argv in CANARIES]
    jobs = [job for argv in commands if (job := doc_commands.child_job(argv))]
    checked = doc_commands.child_checks(jobs, tmp_path_factory.mktemp("checks"))
    return recorded, checked, canary_scratch


def test_dry_run_checks_tell_a_misspelt_flag_from_a_good_one(dry_runs):
    _, checked, scratch = dry_runs
    problem = functools.partial(doc_commands.command_problem, scratch=scratch, checked=checked)
    assert problem(GOOD_SERVE) is None
    assert problem(PLACEHOLDER_SERVE) is None
    assert "--max-model-lenn" in problem(MISSPELT_SERVE)
    assert problem(GOOD_SCRIPT) is None
    assert "--repeatz" in problem(MISSPELT_SCRIPT)
    assert problem(["make", "serve"]) is None
    assert "no-such-target" in problem(["make", "no-such-target"])


@pytest.mark.parametrize("block", blocks_of("dry-run"))
def test_dry_run_block_commands_pass_their_checks(block, dry_runs):
    if not block.is_shell:  # python: compiled, not run
        compile(block.text, block.name, "exec")
        return
    assert doc_commands.syntax_problem(block.text) is None, block.name
    recorded, checked, _ = dry_runs
    scratch, calls, stderr = recorded[block.name]
    assert not stderr.strip(), f"{block.name} ran something with no dry-run check:\n{stderr}"
    assert calls, f"{block.name} runs no command"
    problems = [doc_commands.command_problem(argv, scratch, checked) for argv in calls]
    problems = [problem for problem in problems if problem]
    assert not problems, f"{block.name}:\n" + "\n".join(problems)
