"""NpuExtAttentionUpdate operator package, checked without CANN.

- The tiling and per-tile offset header is compiled with g++ and swept: every element read
  and written exactly once, tiles fit the UB, tail tiles right, 64-bit offsets exact.
- The kernel itself runs on the host in tests/cann_ops/test_kernel_on_host.py; here its host
  build is the emulated kernel of the torch binding op.
- The torch binding (schema, fake kernel, kernel lookup), the torchair converter and the
  names used by op_host, op_api, kernel, torch schema and converter are checked to agree.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import types

import pytest
import torch
from support.scripts import ROOT

from vllm_npu_ext import cann_ops
from vllm_npu_ext.cann_ops import binding
from vllm_npu_ext.cann_ops.npu_ext_attention_update import TILING_MATH_HEADER
from vllm_npu_ext.cann_ops.npu_ext_attention_update.host_kernel.library import TILING_FIELDS
from vllm_npu_ext.cann_ops.npu_ext_attention_update.tests import golden, host_build
from vllm_npu_ext.cann_ops.npu_ext_attention_update.tests import source_names as names
from vllm_npu_ext.cann_ops.npu_ext_attention_update.torch_binding import (
    extension_build,
    torchair_converter,
)
from vllm_npu_ext.emulator.operators import npu_ext_cann as emulated_cann_ops
from vllm_npu_ext.ops import attention_update as public
from vllm_npu_ext.selfcheck.tolerances import op_tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("npu_ext_attention_update_host")


def random_inputs(sp, rows, head_dim, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lse = torch.randn(sp, rows, generator=generator) * 4
    go = torch.randn(sp, rows, head_dim, generator=generator).to(dtype)
    return lse, go


def assert_matches_golden(out, lse_out, lse, go, update_type):
    ref_out, ref_lse = golden.npu_ext_attention_update_golden(
        lse.numpy(), go.float().numpy(), update_type
    )
    tol = op_tolerance("npu_attention_update", go.dtype)
    rtol, atol = tol.rtol, tol.atol
    torch.testing.assert_close(out.double(), torch.from_numpy(ref_out), rtol=rtol, atol=atol)
    if update_type == 1:
        torch.testing.assert_close(lse_out.double(), torch.from_numpy(ref_lse), rtol=1e-6,
                                   atol=1e-6)


# ---- the g++ sweep of the tiling header ----


def test_tiling_sweep_reads_and_writes_every_element_exactly_once(build_dir):
    result = host_build.run_sweep(host_build.build_sweep(build_dir))
    assert result.returncode == 0, result.output
    counters = result.counters
    assert counters["failures"] == 0
    assert counters["configs"] >= 15000 and counters["tiled"] >= 15000
    assert counters["rejected_ub"] > 0  # UBs too small for one row were met and refused
    assert counters["intervals"] > counters["tiles"] > counters["tiled"]


MUTATIONS = {
    "shard stride one row short": (
        "static_cast<uint64_t>(shard) * tiling.totalLength +",
        "static_cast<uint64_t>(shard) * (tiling.totalLength - 1) +",
    ),
    "tail tile one row too long": (
        "return left < tileLength ? left : tileLength;",
        "return left < tileLength ? left + 1 : tileLength;",
    ),
    "UB total missing a buffer": ("return queues + 2 * rowVector", "return queues + rowVector"),
}


@pytest.mark.parametrize(("original", "mutated"), MUTATIONS.values(), ids=MUTATIONS.keys())
def test_tiling_sweep_catches_a_broken_formula(tmp_path, original, mutated):
    header = TILING_MATH_HEADER.read_text()
    assert original in header
    (tmp_path / TILING_MATH_HEADER.name).write_text(header.replace(original, mutated))
    result = host_build.run_sweep(host_build.build_sweep(tmp_path, header_dir=tmp_path))
    assert result.returncode == 1
    assert result.counters["failures"] > 0


# ---- the torch binding ----


@pytest.fixture
def emulated_cpu_kernel():
    """The emulator's CPU kernel (the host build of our kernel); yields its call counter."""
    emulated_cann_ops.calls.clear()
    with emulated_cann_ops.emulated():
        yield emulated_cann_ops.calls


def test_custom_kernel_available_only_with_a_registered_kernel():
    assert not binding.custom_kernel_available("cpu")
    assert not binding.custom_kernel_available("npu")  # no compiled extension here
    assert not binding.custom_kernel_available(torch.device("meta"))


def test_emulated_cpu_kernel_serves_the_binding_op(emulated_cpu_kernel):
    assert binding.custom_kernel_available(torch.device("cpu"))
    lse, go = random_inputs(4, 33, 64, torch.bfloat16, seed=3)
    out, lse_out = torch.ops.npu_ext_cann.npu_ext_attention_update(lse, go, 1)
    assert emulated_cpu_kernel[emulated_cann_ops.OP_NAME] == 1
    assert_matches_golden(out, lse_out, lse, go, 1)


def test_public_npu_path_takes_the_custom_kernel(emulated_cpu_kernel, monkeypatch):
    monkeypatch.setenv(public.KERNEL_SWITCH, "custom")
    lse, go = random_inputs(3, 20, 16, torch.float16, seed=4)
    out, lse_out = public.attention_update_npu(lse, go, 1)
    assert emulated_cpu_kernel[emulated_cann_ops.OP_NAME] == 1
    ref_out, ref_lse = public.attention_update_reference(lse, go, 1)
    torch.testing.assert_close(out, ref_out, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse_out, ref_lse, rtol=1e-6, atol=1e-6)


def test_binding_op_passes_opcheck(emulated_cpu_kernel):
    lse, go = random_inputs(2, 16, 32, torch.float32, seed=5)
    torch.library.opcheck(torch.ops.npu_ext_cann.npu_ext_attention_update.default, (lse, go, 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fake_kernel_gives_output_shapes_and_dtypes(dtype):
    lse = torch.empty(3, 10, device="meta")
    go = torch.empty(3, 10, 64, dtype=dtype, device="meta")
    out, lse_out = torch.ops.npu_ext_cann.npu_ext_attention_update(lse, go, 0)
    assert (out.shape, out.dtype) == ((10, 64), dtype)
    assert (lse_out.shape, lse_out.dtype) == ((10,), torch.float32)


def test_fake_kernel_rejects_an_out_of_range_sp():
    with pytest.raises(ValueError, match="sp"):
        torch.ops.npu_ext_cann.npu_ext_attention_update(
            torch.empty(17, 4, device="meta"), torch.empty(17, 4, 64, device="meta"), 0
        )


# ---- graph mode ----


@pytest.fixture
def fake_torchair(monkeypatch):
    """torch_npu.dynamo.torchair stand-in recording converter registrations and GE nodes."""
    registrations, ge_nodes = [], []

    def register_fx_node_ge_converter(op):
        def decorate(converter):
            registrations.append((op, converter))
            return converter

        return decorate

    torchair = types.ModuleType("torch_npu.dynamo.torchair")
    torchair.register_fx_node_ge_converter = register_fx_node_ge_converter
    torchair.ge = types.SimpleNamespace(
        custom_op=lambda op_type, **kwargs: ge_nodes.append((op_type, kwargs)) or ("o", "l"),
        attr=types.SimpleNamespace(Int=lambda value: ("Int", value)),
    )
    dynamo = types.ModuleType("torch_npu.dynamo")
    dynamo.torchair = torchair
    torch_npu = types.ModuleType("torch_npu")
    torch_npu.dynamo = dynamo
    for name, module in (("torch_npu", torch_npu), ("torch_npu.dynamo", dynamo),
                         ("torch_npu.dynamo.torchair", torchair)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(binding, "_converters_registered_with", None)
    return registrations, ge_nodes


def test_register_graph_converter_is_false_without_torchair(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr(binding, "_converters_registered_with", None)
    assert binding.register_graph_converter() is False


def test_graph_converters_emit_one_npu_ext_attention_update_node(fake_torchair):
    registrations, ge_nodes = fake_torchair
    assert binding.register_graph_converter() and binding.register_graph_converter()
    ops = [op for op, _ in registrations]
    assert ops == [
        torch.ops.vllm_npu_ext.attention_update.default,
        torch.ops.npu_ext_cann.npu_ext_attention_update.default,
    ]  # each registered once, although registration was asked for twice
    for op, converter in registrations:
        schema_args = [argument.name for argument in op._schema.arguments]
        assert list(inspect.signature(converter).parameters)[:3] == schema_args
        assert converter(*schema_args[:2], 1, meta_outputs=None) == ("o", "l")
    expected_nodes = [
        (cann_ops.OP_TYPE, {"inputs": {"lse": "lse", "go": go_name},
                            "attrs": {"update_type": ("Int", 1)},
                            "outputs": ["out", "lse_out"]})
        for go_name in ("out", "go")
    ]
    assert ge_nodes == expected_nodes


# ---- names agree across layers ----


def test_op_definition_is_the_renamed_tensor_input_operator():
    definition = names.op_definition()
    assert definition["class"] == definition["op_add"] == [cann_ops.OP_TYPE]
    assert definition["inputs"] == ["lse", "go"]
    assert definition["attrs"] == ["update_type"]
    assert definition["outputs"] == ["out", "lse_out"]
    assert definition["param_types"] == ["REQUIRED"] * 4  # no DYNAMIC tensor lists
    assert definition["socs"] == ["ascend910b", "ascend910_93"]
    positions = {"kLseIndex": definition["inputs"].index("lse"),
                 "kGoIndex": definition["inputs"].index("go"),
                 "kOutIndex": definition["outputs"].index("out"),
                 "kLseOutIndex": definition["outputs"].index("lse_out"),
                 "kUpdateTypeAttrIndex": definition["attrs"].index("update_type")}
    for constant, position in positions.items():  # indices used by infershape and tiling
        assert names.header_constant(constant, names.IO_HEADER) == position


def test_every_layer_lists_inputs_attrs_and_outputs_in_definition_order():
    definition = names.op_definition()
    inputs, attrs, outputs = definition["inputs"], definition["attrs"], definition["outputs"]
    snake = lambda params: [names.snake_case(p) for p in params]  # noqa: E731
    aclnn = names.function_params(names.read(names.ACLNN_HEADER),
                                  f"aclnn{cann_ops.OP_TYPE}GetWorkspaceSize")
    assert snake(aclnn) == inputs + attrs + outputs + ["workspace_size", "executor"]
    level0 = names.read(names.L0_SOURCE)
    assert [snake(args) for args in names.macro_args(level0, "OP_INPUT")] == [inputs] * 2
    assert [snake(args) for args in names.macro_args(level0, "OP_OUTPUT")] == [outputs] * 2
    assert [snake(args) for args in names.macro_args(level0, "OP_ATTR")] == [attrs] * 2
    kernel = names.function_params(names.read(names.KERNEL_ENTRY),
                                   names.snake_case(cann_ops.OP_TYPE))
    assert kernel == inputs + outputs + ["workspace", "tiling"]
    schema = torch._C.parse_schema(binding.OP_SCHEMA)
    assert [argument.name for argument in schema.arguments] == inputs + attrs
    assert len(schema.returns) == len(outputs)
    for function in (binding.npu_ext_attention_update_fake, golden.npu_ext_attention_update_golden):
        assert list(inspect.signature(function).parameters) == inputs + attrs
    cpp_binding = names.function_params(names.read(names.TORCH_BINDING), "AttentionUpdateNpu")
    assert cpp_binding == inputs + attrs
    converter = (torchair_converter.GE_INPUTS, torchair_converter.GE_ATTRS,
                 torchair_converter.GE_OUTPUTS)
    assert converter == (tuple(inputs), tuple(attrs), tuple(outputs))


def test_binding_registers_our_aclnn_functions_under_our_torch_names():
    op_type = cann_ops.OP_TYPE
    assert op_type != "AttentionUpdate" and op_type.startswith("NpuExt")
    assert {f"aclnn{op_type}GetWorkspaceSize", f"aclnn{op_type}"} <= set(
        names.string_literals(names.ACLNN_LIBRARY)
    )
    cpp = names.read(names.TORCH_BINDING)
    assert f"TORCH_LIBRARY_IMPL({binding.LIBRARY_NAMESPACE}, PrivateUse1, m)" in cpp
    assert f'm.impl("{binding.OP_NAME}"' in cpp
    assert names.KERNEL_ENTRY.name == f"{names.snake_case(op_type)}.cpp"
    assert f"OP_TYPE_REGISTER({op_type})" in names.read(names.L0_SOURCE)


def test_tiling_data_and_keys_agree_between_host_and_kernel():
    assert names.tiling_data_fields() == names.tiling_struct_fields() == list(TILING_FIELDS)
    assert names.kernel_tiling_keys() == names.host_tiling_keys() == [1, 2, 3]


def test_header_limits_are_the_public_op_limits():
    assert (names.header_constant("kMinSp"), names.header_constant("kMaxSp")) == public.SP_RANGE
    assert (names.header_constant("kMinHeadDim"),
            names.header_constant("kMaxHeadDim")) == public.HEAD_DIM_RANGE
    assert names.header_constant("kHeadDimMultiple") == public.HEAD_DIM_MULTIPLE


def test_build_script_installs_our_vendor_to_the_default_path():
    script = (names.OP_DIR / "build.sh").read_text()
    assert f'VENDOR_NAME="{cann_ops.VENDOR_NAME}"' in script
    default = script.split('DEFAULT_INSTALL_PATH="${OP_DIR}/')[1].split('"')[0]
    assert (names.OP_DIR / default).resolve() == cann_ops.DEFAULT_INSTALL_PATH
    cmake = (names.OP_DIR / "CMakeLists.txt").read_text()
    assert f'set(vendor_name "{cann_ops.VENDOR_NAME}"' in cmake


# ---- setup.py's optional extension ----


def test_extension_build_is_skipped_here_with_one_line(capsys):
    assert extension_build.extension_modules({}) == ([], {})
    assert capsys.readouterr().out.count(f"skipping {extension_build.EXTENSION_NAME}") == 1


def test_extension_build_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(extension_build.importlib.util, "find_spec", lambda name: object())
    assert "ASCEND_HOME_PATH" in extension_build.skip_reason({})
    assert "lacks aclnn/acl_meta.h" in extension_build.skip_reason(
        {"ASCEND_TOOLKIT_HOME": str(tmp_path)}
    )


def test_setup_py_runs_on_cpu_and_says_once_why_the_binding_is_skipped():
    completed = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT,
                               capture_output=True, text=True, check=True)
    assert completed.stdout.count("skipping vllm_npu_ext._cann_C") == 1
    assert completed.stdout.strip().endswith("vllm-npu-ext")
