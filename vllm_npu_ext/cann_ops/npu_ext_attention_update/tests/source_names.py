"""Read operator names out of the package's C++ sources, for the consistency tests.

Each function returns the names one layer uses (op definition, aclnn API, level-0 launch,
kernel entry, tiling data, torch binding) in the order that layer lists them, so the tests
can check that every layer agrees on the op type, input/attr/output names and their order.
"""

from __future__ import annotations

import re
from pathlib import Path

from vllm_npu_ext.cann_ops.npu_ext_attention_update import OP_DIR

OP_DEF = OP_DIR / "op_host" / "npu_ext_attention_update_def.cpp"
IO_HEADER = OP_DIR / "op_host" / "npu_ext_attention_update_io.h"
TILING_HEADER = OP_DIR / "op_host" / "npu_ext_attention_update_tiling.h"
TILING_SOURCE = OP_DIR / "op_host" / "npu_ext_attention_update_tiling.cpp"
TILING_MATH = OP_DIR / "op_kernel" / "attention_update_tiling_math.h"
KERNEL_ENTRY = OP_DIR / "op_kernel" / "npu_ext_attention_update.cpp"
ACLNN_HEADER = OP_DIR / "op_api" / "aclnn_npu_ext_attention_update.h"
L0_SOURCE = OP_DIR / "op_api" / "npu_ext_attention_update_l0.cpp"
TORCH_BINDING = OP_DIR / "torch_binding" / "npu_ext_attention_update_binding.cpp"
ACLNN_LIBRARY = OP_DIR / "torch_binding" / "aclnn_library.cpp"


def snake_case(name: str) -> str:
    """updateType -> update_type, NpuExtAttentionUpdate -> npu_ext_attention_update."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def read(path: Path) -> str:
    return _strip_comments(path.read_text(encoding="utf-8"))


def op_definition(path: Path = OP_DEF) -> dict[str, list[str]]:
    """class name, inputs, outputs, attrs, param types, SoCs and OP_ADD of the op definition."""
    text = read(path)
    return {
        "class": re.findall(r"class\s+(\w+)\s*:\s*public\s+OpDef", text),
        "inputs": re.findall(r"Input\(\"(\w+)\"\)", text),
        "outputs": re.findall(r"Output\(\"(\w+)\"\)", text),
        "attrs": re.findall(r"Attr\(\"(\w+)\"\)", text),
        "param_types": re.findall(r"ParamType\((\w+)\)", text),
        "socs": re.findall(r"AddConfig\(\"(\w+)\"\)", text),
        "op_add": re.findall(r"OP_ADD\((\w+)\)", text),
    }


def function_params(text: str, function: str) -> list[str]:
    """Parameter names of the first declaration/definition of `function` in `text`."""
    match = re.search(rf"\b{re.escape(function)}\s*\(([^)]*)\)", text)
    if match is None:
        raise ValueError(f"{function} not found")
    params = [p.strip() for p in match.group(1).split(",") if p.strip()]
    return [re.findall(r"(\w+)\s*(?:=.*)?$", p)[0] for p in params]


def macro_args(text: str, macro: str) -> list[list[str]]:
    """Arguments of every `macro(...)` use, e.g. OP_INPUT(lse, go) -> [["lse", "go"]]."""
    uses = re.findall(rf"{macro}\(([^)]*)\)", text)
    return [[argument.strip() for argument in arguments.split(",")] for arguments in uses]


def tiling_data_fields(path: Path = TILING_HEADER) -> list[str]:
    return re.findall(r"TILING_DATA_FIELD_DEF\(\w+,\s*(\w+)\)", read(path))


def tiling_struct_fields(path: Path = TILING_MATH) -> list[str]:
    """Fields of struct AttentionUpdateTiling in the shared header."""
    body = re.search(r"struct AttentionUpdateTiling\s*\{(.*?)\};", read(path), flags=re.S)
    return re.findall(r"uint32_t\s+(\w+);", body.group(1))


def header_constant(name: str, path: Path = TILING_MATH) -> int:
    match = re.search(rf"constexpr\s+\w+\s+{name}\s*=\s*(\w+?)(?:ULL|U)?;", read(path))
    return int(match.group(1), 0)


def kernel_tiling_keys(path: Path = KERNEL_ENTRY) -> list[int]:
    return [int(key) for key in re.findall(r"TILING_KEY_IS\((\d+)\)", read(path))]


def host_tiling_keys(path: Path = TILING_SOURCE) -> list[int]:
    return [int(key) for key in re.findall(r"kTilingKey\w+\s*=\s*(\d+);", read(path))]


def string_literals(path: Path) -> list[str]:
    return re.findall(r"\"([^\"]*)\"", read(path))
