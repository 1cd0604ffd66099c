"""Extract the torch_npu operator schemas the emulator checks calls against.

Reads the schema strings torch_npu registers with torch (its TORCH_LIBRARY definitions, kept
as strings in `torch_npu/lib/libtorch_npu.so`) straight out of a torch-npu wheel (a zip;
nothing is installed), keeps those of the emulated operators (every overload), parses each
into its argument list and writes
`vllm_npu_ext/emulator/runtime/torch_npu_schemas.json` with the wheel's name and version.

The library, not the wheel's codegen input
(`torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml`), is what `torch.ops.npu` defines,
and the two differ: in 2.10.0.post4 the registered schemas
name the first argument of npu_rms_norm, npu_rotary_mul, npu_swiglu, npu_quantize and
npu_format_cast `input` (the YAML: `self`), and `npu_fused_infer_attention_score.out` takes
`Tensor[] out` (the YAML: `Tensor(a!) attention_out, Tensor(b!) softmax_lse`), which is how
vllm-ascend calls it (`out=[output, softmax_lse]`, vllm-ascend 0.23.0.post1
`AscendAttentionBackendImpl.update_graph_params`).

The pinned version is the one vllm-ascend 0.23.0.post1 requires (its requirements.txt:
`torch-npu==2.10.0.post4`), the torch-npu Ascend users run:

    python scripts/extract_torch_npu_schemas.py                  # pip download 2.10.0.post4
    python scripts/extract_torch_npu_schemas.py --download VERSION
    python scripts/extract_torch_npu_schemas.py path/to/torch_npu-...whl
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

LIBRARY_PATH = "torch_npu/lib/libtorch_npu.so"
PINNED_VERSION = "2.10.0.post4"
# The x86_64 wheel: the schema YAML is byte-identical in the aarch64 one, and pip can fetch
# it on any machine (the platform is named explicitly).
WHEEL_PLATFORM = "manylinux_2_28_x86_64"
WHEEL_PYTHON = "3.11"
DEFAULT_OUTPUT = (
    Path(__file__).resolve().parent.parent
    / "vllm_npu_ext" / "emulator" / "runtime" / "torch_npu_schemas.json"
)
OPERATORS = (
    "npu_fused_infer_attention_score",
    "npu_fusion_attention",
    "npu_rms_norm",
    "npu_add_rms_norm",
    "npu_rotary_mul",
    "npu_swiglu",
    "npu_grouped_matmul",
    "npu_linear",
    "npu_format_cast",
    "npu_attention_update",
    "npu_dynamic_quant",
    "npu_add_rms_norm_dynamic_quant",
    "npu_quantize",
    "npu_add_rms_norm_quant",
    "npu_mrope",
    "_npu_fused_infer_attention_score_get_max_workspace",
)
# Runs of printable ASCII in the library: its string constants, schema strings among them.
_PRINTABLE = re.compile(rb"[\x20-\x7e]{16,}")
_SCHEMA = re.compile(
    r"^(?P<name>[A-Za-z_]\w*)(?:\.(?P<overload>\w+))?\((?P<args>.*)\)\s*->\s*(?P<ret>.+)$"
)


def split_top_level(text: str) -> list[str]:
    """Split `text` on commas that are not inside (), [] or quotes."""
    parts, depth, quote, current = [], 0, None, []
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    tail = "".join(current).strip()
    return parts + [tail] if tail else parts


def parse_default(text: str):
    """A schema default (`None`, `1.`, `"BSH"`, `'half'`, `False`, `[]`) as a JSON value."""
    if text in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[text]
    if text[:1] in "'\"" and text[-1:] == text[:1]:
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        return [parse_default(item) for item in split_top_level(text[1:-1])]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"unsupported schema default {text!r}") from None


def parse_argument(text: str, keyword_only: bool) -> dict:
    """One `Type name=default` schema argument as a dict."""
    declaration, has_default, default_text = text.partition("=")
    arg_type, _, name = declaration.strip().rpartition(" ")
    if not arg_type or not name:
        raise ValueError(f"cannot parse schema argument {text!r}")
    return {
        "name": name,
        "type": arg_type,
        "optional": arg_type.endswith("?"),
        "has_default": bool(has_default),
        "default": parse_default(default_text.strip()) if has_default else None,
        "keyword_only": keyword_only,
    }


def parse_schema(schema: str) -> dict:
    """Parse `name.overload(args) -> returns` into name, overload, arguments and returns."""
    match = _SCHEMA.match(schema.strip())
    if match is None:
        raise ValueError(f"not an operator schema: {schema!r}")
    arguments, keyword_only = [], False
    for part in split_top_level(match["args"]):
        if part == "*":
            keyword_only = True
            continue
        arguments.append(parse_argument(part, keyword_only))
    return {
        "name": match["name"],
        "overload": match["overload"] or "",
        "schema": schema.strip(),
        "arguments": arguments,
        "returns": match["ret"].strip(),
    }


def collect_schemas(library: bytes, operators=OPERATORS) -> dict[str, list[dict]]:
    """Every overload of `operators` whose schema string the library holds (C++ signatures,
    which have no `->`, do not match); ValueError for an operator with none, or for two
    different schemas of one overload."""
    found: dict[str, dict[str, dict]] = {name: {} for name in operators}
    for raw in _PRINTABLE.findall(library):
        text = raw.decode("ascii").strip()
        match = _SCHEMA.match(text)
        if match is None or match["name"] not in found:
            continue
        parsed = parse_schema(text)
        known = found[parsed["name"]].setdefault(parsed["overload"], parsed)
        if known["schema"] != parsed["schema"]:
            raise ValueError(f"two schemas for {text.split('(')[0]}: {known['schema']!r}, {text!r}")
    missing = [name for name, schemas in found.items() if not schemas]
    if missing:
        raise ValueError(f"operators missing from {LIBRARY_PATH}: {missing}")
    return {
        name: [schemas[overload] for overload in sorted(schemas, key=lambda o: o != "")]
        for name, schemas in found.items()
    }


def wheel_version(wheel: zipfile.ZipFile) -> str:
    """The `Version:` field of the wheel's METADATA."""
    for member in wheel.namelist():
        if member.endswith(".dist-info/METADATA"):
            for line in wheel.read(member).decode("utf-8").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    raise ValueError("wheel has no dist-info METADATA with a Version field")


def extract(wheel_path: Path) -> dict:
    """The schema document for `wheel_path` (what gets written as JSON)."""
    with zipfile.ZipFile(wheel_path) as wheel:
        library = wheel.read(LIBRARY_PATH)
        version = wheel_version(wheel)
    return {
        "source_wheel": wheel_path.name,
        "torch_npu_version": version,
        "library_path": LIBRARY_PATH,
        "operators": collect_schemas(library),
    }


def wheel_name(version: str) -> str:
    """The file name of the torch-npu wheel `download` fetches."""
    tag = "cp" + WHEEL_PYTHON.replace(".", "")
    return f"torch_npu-{version}-{tag}-{tag}-{WHEEL_PLATFORM}.whl"


def download(version: str, directory: Path) -> Path:
    """`pip download` the torch-npu wheel into `directory` (no dependencies, nothing installed).

    A wheel already in `directory` is reused. RuntimeError with pip's own message when the
    download fails (no registry, no such version).
    """
    wheel = directory / wheel_name(version)
    if wheel.is_file():
        return wheel
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--python-version", WHEEL_PYTHON, "--platform", WHEEL_PLATFORM,
         "--dest", str(directory), f"torch-npu=={version}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not wheel.is_file():
        raise RuntimeError(
            f"pip download of torch-npu=={version} ({wheel.name}) failed with exit status "
            f"{done.returncode}: {(done.stderr or done.stdout).strip()[-2000:]}"
        )
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("wheel", nargs="?", type=Path, help="a torch_npu wheel file")
    source.add_argument(
        "--download", metavar="VERSION", default=PINNED_VERSION,
        help=f"pip download torch-npu==VERSION (default: {PINNED_VERSION}, the pinned version)",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or download(args.download, Path(tmp))
        document = extract(wheel)
    args.output.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    counts = {name: len(schemas) for name, schemas in document["operators"].items()}
    print(f"wrote {args.output} (torch-npu {document['torch_npu_version']}): {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
