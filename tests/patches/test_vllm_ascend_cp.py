"""The vllm-ascend CP merge patch on both CPU stacks, without vllm-ascend on the path.

Here vLLM's CPU platform is current, so vllm-ascend's modules are not imported: the original
`_npu_attention_update` is taken verbatim from its sdist and run with vLLM's group accessors
replaced by stand-ins and torch_npu by the emulator (our replacement reads vllm-ascend's own
buffer layout the same way), and the import hook is exercised on a minimal fake package.
vllm-ascend's real modules, in gloo ranks with its own pair, run in tests/with_vllm_ascend. The
sdist is found through VLLM_ASCEND_SDIST, build/sdist, or downloaded from PyPI by
scripts/check_vllm_ascend_patch.py (sha256-pinned), whose source checks run here too.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest
import torch
import torch.distributed as dist
from support.scripts import load_script

from vllm_npu_ext import emulator, envs
from vllm_npu_ext.patches import apply_patches, pins, vllm_ascend_cp

ROOT = Path(__file__).resolve().parents[2]
check_script = load_script("scripts/check_vllm_ascend_patch.py")

SDIST_CANDIDATES = (ROOT / "build" / "sdist" / check_script.SDIST_NAME,)


def find_or_download_sdist() -> Path:
    configured = os.environ.get("VLLM_ASCEND_SDIST")
    for candidate in ([Path(configured)] if configured else []) + list(SDIST_CANDIDATES):
        if candidate.exists():
            return candidate
    try:
        return check_script.download_sdist(ROOT / "build" / "sdist")
    except OSError as error:
        pytest.fail(f"vllm-ascend sdist unavailable ({error}); set VLLM_ASCEND_SDIST")


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return check_script.read_sources(find_or_download_sdist())


def original_sources(sources) -> dict[str, str]:
    return {
        name: check_script.function_source(sources, vllm_ascend_cp.COMMON_MODULE, name)
        for name in vllm_ascend_cp.TARGET_SIGNATURES
    }


@dataclass
class Coordinator:
    """The part of vLLM's GroupCoordinator that the CP merge uses."""

    world_size: int
    device_group: object = None

    def all_gather(self, tensor, dim=-1):
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)


def load_originals(function_sources: dict[str, str], dcp: Coordinator, pcp: Coordinator):
    """vllm-ascend's functions, run against our stand-ins for its module globals."""
    namespace = {
        "torch": torch,
        "dist": dist,
        "torch_npu": emulator,
        "get_dcp_group": lambda: dcp,
        "get_pcp_group": lambda: pcp,
        "get_decode_context_model_parallel_world_size": lambda: dcp.world_size,
    }
    for text in function_sources.values():
        exec(compile(text, vllm_ascend_cp.COMMON_MODULE, "exec"), namespace)
    return {name: namespace[name] for name in function_sources}


def vllm_ascend_buffer(dcp, pcp, bs, heads, head_dim, seed=0):
    """A gathered buffer in vllm-ascend's `[pcp*bs, dcp*H, D+1]` layout, as it produces it."""
    generator = torch.Generator().manual_seed(seed)
    if pcp == 1 and dcp > 1:  # the all_to_all output, permuted (not copied) back
        received = torch.randn(dcp * heads, head_dim + 1, bs, generator=generator)
        return received.permute(2, 0, 1)
    return torch.randn(pcp * bs, dcp * heads, head_dim + 1, generator=generator)


@pytest.mark.parametrize(("dcp", "pcp"), [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (2, 4)])
def test_replacement_reproduces_npu_attention_update(sources, monkeypatch, dcp, pcp):
    coordinators = (Coordinator(dcp), Coordinator(pcp))
    monkeypatch.setattr(vllm_ascend_cp, "cp_group_coordinators", lambda: coordinators)
    original = load_originals(original_sources(sources), *coordinators)["_npu_attention_update"]
    bs, heads, head_dim = 3, 4, 128
    buffer = vllm_ascend_buffer(dcp, pcp, bs, heads, head_dim, seed=dcp * 10 + pcp)
    expected = original(head_dim, buffer)
    ours_layout = vllm_ascend_cp._from_vllm_ascend_layout(buffer, dcp, pcp)
    assert ours_layout.shape == (dcp * pcp, bs, heads, head_dim + 1)
    for attn_out_lse in (buffer, ours_layout):
        result = vllm_ascend_cp.npu_attention_update(head_dim, attn_out_lse)
        assert result.shape == expected.shape == (bs, heads, head_dim)
        torch.testing.assert_close(result, expected, atol=1e-6, rtol=1e-6)


# --- requests of which a rank holds no key ---------------------------------------------


def cp_step(monkeypatch, lengths, dcp_rank=0, pcp_rank=0, num_decodes=None):
    """A decode step as vllm-ascend's CP builder leaves it in vLLM's forward context: one
    layer whose `decode_meta.num_computed_tokens_of_pcp_dcp` is `lengths` [bs, pcp, dcp]
    (the key counts FIA is called with), and the rank's group coordinators."""
    from vllm import forward_context

    lengths = numpy.asarray(lengths)
    bs, pcp, dcp = lengths.shape
    layer = SimpleNamespace(
        num_decodes=bs if num_decodes is None else num_decodes,
        decode_meta=SimpleNamespace(num_computed_tokens_of_pcp_dcp=lengths),
    )
    context = SimpleNamespace(attn_metadata={"model.layers.0.self_attn.attn": layer})
    monkeypatch.setattr(forward_context, "_forward_context", context)
    coordinators = (
        SimpleNamespace(world_size=dcp, rank_in_group=dcp_rank, device_group=None),
        SimpleNamespace(world_size=pcp, rank_in_group=pcp_rank, device_group=None),
    )
    monkeypatch.setattr(vllm_ascend_cp, "cp_group_coordinators", lambda: coordinators)


def test_empty_shard_masks_read_this_rank_s_key_counts(monkeypatch):
    lengths = [[[3, 0], [2, 5]], [[0, 0], [0, 0]], [[1, 2], [0, 4]]]  # [bs, pcp, dcp]
    cp_step(monkeypatch, lengths, dcp_rank=1, pcp_rank=0)
    local, everywhere = vllm_ascend_cp.empty_shard_masks(3, torch.device("cpu"))
    assert local.tolist() == [True, True, False]  # lengths[:, pcp_rank, dcp_rank] == 0
    assert everywhere.tolist() == [False, True, False]
    cp_step(monkeypatch, lengths, dcp_rank=0, pcp_rank=1)
    local, _ = vllm_ascend_cp.empty_shard_masks(3, torch.device("cpu"))
    assert local.tolist() == [False, True, True]
    cp_step(monkeypatch, lengths, dcp_rank=0, pcp_rank=0)
    local, _ = vllm_ascend_cp.empty_shard_masks(3, torch.device("cpu"))
    assert local.tolist() == [False, True, False]


def test_no_masks_without_empty_rows_metadata_or_outside_capture(monkeypatch):
    cp_step(monkeypatch, [[[3, 1]], [[2, 2]]])
    assert vllm_ascend_cp.empty_shard_masks(2, torch.device("cpu")) == (None, None)
    cp_step(monkeypatch, [[[0, 1]], [[2, 2]]], num_decodes=5)  # not this merge's rows
    assert vllm_ascend_cp.empty_shard_masks(2, torch.device("cpu")) == (None, None)
    cp_step(monkeypatch, [[[0, 0]], [[2, 2]]])
    monkeypatch.setattr(torch, "npu", SimpleNamespace(is_current_stream_capturing=lambda: True),
                        raising=False)  # fmt: skip
    assert vllm_ascend_cp.empty_shard_masks(2, torch.device("cpu")) == (None, None)


def test_empty_shard_masks_are_computed_once_per_step(monkeypatch):
    """Every layer of a step reads the same metadata: the masks of its first layer serve the
    others; the next step's metadata (a new array) gets its own."""
    cp_step(monkeypatch, [[[0, 1]], [[2, 2]]])
    first = vllm_ascend_cp.empty_shard_masks(2, torch.device("cpu"))
    again = vllm_ascend_cp.empty_shard_masks(2, torch.device("cpu"))
    assert first[0] is again[0] and first[0].tolist() == [True, False]
    cp_step(monkeypatch, [[[2, 1]], [[0, 2]]])
    assert vllm_ascend_cp.empty_shard_masks(2, torch.device("cpu"))[0].tolist() == [False, True]


@pytest.mark.parametrize("kernel", ["custom", "list"])
def test_patched_merge_gives_zero_for_a_request_without_keys_whatever_fia_wrote(
    monkeypatch, kernel
):
    """One rank (no group to exchange with): request 1 has no key anywhere; FIA's result for
    it is garbage (NaN out, an lse of 50). The patched pair sends it as 0/-inf and returns 0
    for it on both kernels (torch_npu's TensorList kernel alone would give NaN), and the
    attention of the others unchanged."""
    from vllm_npu_ext.emulator.operators import npu_ext_cann as emulated_cann_ops
    from vllm_npu_ext.ops.attention_update import MergeKernel

    cp_step(monkeypatch, [[[4]], [[0]], [[1]]])
    monkeypatch.setattr(vllm_ascend_cp, "_merge_kernel", MergeKernel(kernel))
    attn_out = torch.randn(3, 4, 64)
    attn_out[1] = float("nan")
    attn_lse = torch.randn(3, 4, 1)
    attn_lse[1] = 50.0
    with emulator.emulated(), emulated_cann_ops.emulated():
        buffer = vllm_ascend_cp.process_attn_out_lse(attn_out, attn_lse)
        merged = vllm_ascend_cp.npu_attention_update(64, buffer)
    assert torch.all(buffer[0, 1, :, :64] == 0) and buffer[0, 1, :, 64].isneginf().all()
    assert torch.all(merged[1] == 0)
    torch.testing.assert_close(merged[[0, 2]], attn_out[[0, 2]])
    assert vllm_ascend_cp._rows_without_keys is None  # used by this merge only


def chunked_context(lengths, query_lens, total):
    """vllm-ascend's chunked-context metadata as the CP builder makes it
    (`attention_cp.py:160-203`): every rank's context lengths `[reqs, pcp, dcp]`, the
    cumulative query lengths FIA takes, this rank's total of context keys."""
    return SimpleNamespace(prefill=SimpleNamespace(chunked_context=SimpleNamespace(
        local_context_lens_allranks=torch.tensor(lengths, dtype=torch.int32),
        actual_chunk_seq_lengths=torch.cumsum(torch.tensor(query_lens), dim=0),
        local_total_toks=total,
    )))  # fmt: skip


def test_a_context_chunk_sends_a_request_without_context_here_as_zero():
    """DCP rank 1 of 2: request 0 has context here, request 1 on rank 0 only (FIA's rows for
    its 0 keys here: NaN, lse 50), request 2 none anywhere (vllm-ascend drops its rows after
    the merge: left alone). Request 1's rows go out as 0 / -inf; the others as FIA wrote them."""
    out, lse = torch.randn(6, 4, 64), torch.randn(6, 4, 1)
    out[2:], lse[2:] = float("nan"), 50.0
    wrapped = vllm_ascend_cp._masking_empty_context(lambda self, q, kv, meta: (out, lse))
    rank = SimpleNamespace(pcp_rank=0, dcp_rank=1)
    metadata = chunked_context([[[4, 3]], [[1, 0]], [[0, 0]]], [2, 3, 1], total=3)
    masked_out, masked_lse = wrapped(rank, None, None, metadata)
    assert torch.all(masked_out[2:5] == 0) and masked_lse[2:5].isneginf().all()
    torch.testing.assert_close(masked_out[:2], out[:2])
    torch.testing.assert_close(masked_lse[:2], lse[:2])
    assert masked_out[5].isnan().all() and torch.all(masked_lse[5] == 50.0)
    again = chunked_context([[[4, 3]], [[1, 0]], [[0, 0]]], [2, 3, 1], total=3)
    assert wrapped(rank, None, None, metadata)[0] is not masked_out  # a new result...
    rows = vllm_ascend_cp._context_rows[2]
    wrapped(rank, None, None, metadata)
    assert vllm_ascend_cp._context_rows[2] is rows  # ...from the rows read once per step
    wrapped(rank, None, None, again)
    assert vllm_ascend_cp._context_rows[2] is not rows  # the next step's metadata: read again
    # No request without context here, or no FIA at all (vllm-ascend's 0 / -inf): untouched.
    for lengths, total in (([[[4, 3]], [[1, 2]], [[0, 0]]], 5), ([[[4, 0]], [[1, 0]]], 0)):
        result = wrapped(rank, None, None, chunked_context(lengths, [2, 3, 1][:len(lengths)],
                                                           total))  # fmt: skip
        assert result[0] is out and result[1] is lse


# --- where and when the patch applies -------------------------------------------------

COMMON_CP = """
def _process_attn_out_lse(attn_output, softmax_lse):
    return "original"


def _npu_attention_update({params}):
    return "original"
"""
CALLER = """
from vllm_ascend.attention.context_parallel.common_cp import (
    _npu_attention_update,
    _process_attn_out_lse,
)


def forward_decode(attn_out, attn_lse, head_size):
    attn_out_lse = _process_attn_out_lse(attn_out, attn_lse)
    return _npu_attention_update(head_size, attn_out_lse)
"""


WRAPPED = """

class AscendAttentionCPMetadataBuilder:
    def build(self, common_prefix_len, common_attn_metadata):
        return common_attn_metadata


class AscendAttentionCPImpl:
    def _compute_prefill_context(self, query, kv_cache, attn_metadata):
        return "original"
"""


def fake_source_hashes(update_params="head_size, attn_out_lse") -> list[str]:
    source = COMMON_CP.format(params=update_params)
    return [pins.source_hash_in_module(source, name) for name in vllm_ascend_cp.REPLACEMENTS] + [
        pins.source_hash_in_module(WRAPPED, f"{owner}.{method}")
        for owner, method in vllm_ascend_cp.WRAPPED.items()
    ]


def write_fake_vllm_ascend(root: Path, update_params="head_size, attn_out_lse") -> None:
    package = root / "vllm_ascend" / "attention" / "context_parallel"
    package.mkdir(parents=True)
    for directory in (package, package.parent, package.parent.parent):
        (directory / "__init__.py").write_text("")
    (package / "common_cp.py").write_text(COMMON_CP.format(params=update_params))
    (package / "attention_cp.py").write_text(textwrap.dedent(CALLER) + WRAPPED)
    (package / "mla_cp.py").write_text(textwrap.dedent(CALLER))


def _forget_vllm_ascend():
    for name in [m for m in sys.modules if m == "vllm_ascend" or m.startswith("vllm_ascend.")]:
        del sys.modules[name]


@pytest.fixture
def fake_vllm_ascend(tmp_path, monkeypatch):
    """A minimal importable vllm_ascend; the hook and every import are undone afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(envs.CP_PATCH.name, raising=False)
    monkeypatch.setenv(envs.PCP_INPUT_IDS_PATCH.name, "0")  # its own tests: the runner's hook
    # The fake's functions are not vllm-ascend's: accepted knowingly, as a user would.
    monkeypatch.setenv(envs.ACCEPT_PATCH_SOURCES.name, ",".join(fake_source_hashes()))
    importlib.invalidate_caches()
    yield tmp_path
    vllm_ascend_cp.uninstall()
    _forget_vllm_ascend()


def import_caller(name="attention_cp"):
    return importlib.import_module(f"vllm_ascend.attention.context_parallel.{name}")


def is_patched(module) -> bool:
    return module._npu_attention_update is vllm_ascend_cp.npu_attention_update and (
        module._process_attn_out_lse is vllm_ascend_cp.process_attn_out_lse
    )


def test_without_vllm_ascend_nothing_is_installed():
    assert importlib.util.find_spec("vllm_ascend") is None
    assert apply_patches() == []
    assert not any(isinstance(f, vllm_ascend_cp.PatchOnImport) for f in sys.meta_path)


def test_install_adds_only_a_hook_and_imports_nothing(fake_vllm_ascend):
    write_fake_vllm_ascend(fake_vllm_ascend)
    before = set(sys.modules)
    applied = apply_patches()
    assert len(applied) == 1 and "attention_update" in applied[0]
    new = set(sys.modules) - before
    assert not {m for m in new if m.startswith(("vllm_ascend", "torch_npu"))}
    assert sum(isinstance(f, vllm_ascend_cp.PatchOnImport) for f in sys.meta_path) == 1
    apply_patches()  # idempotent: still one hook
    assert sum(isinstance(f, vllm_ascend_cp.PatchOnImport) for f in sys.meta_path) == 1


def test_importing_a_cp_caller_patches_it_and_routes_decode_to_our_merge(
    fake_vllm_ascend, monkeypatch
):
    write_fake_vllm_ascend(fake_vllm_ascend)
    apply_patches()
    attention_cp, mla_cp = import_caller("attention_cp"), import_caller("mla_cp")
    common_cp = sys.modules[vllm_ascend_cp.COMMON_MODULE]
    assert is_patched(attention_cp) and is_patched(mla_cp)
    assert common_cp._npu_attention_update(1, None) == "original"  # the source is untouched
    for owner, method in vllm_ascend_cp.WRAPPED.items():  # wrapped where defined
        wrapped = getattr(getattr(attention_cp, owner), method)
        assert wrapped.__wrapped__ is vars(getattr(attention_cp, owner))[
            vllm_ascend_cp.WRAPPED_MARKER]  # fmt: skip
    single = (Coordinator(1), Coordinator(1))
    monkeypatch.setattr(vllm_ascend_cp, "cp_group_coordinators", lambda: single)
    attn_out, attn_lse = torch.randn(3, 4, 64), torch.randn(3, 4, 1)
    torch.testing.assert_close(attention_cp.forward_decode(attn_out, attn_lse, 64), attn_out)


def test_a_caller_imported_before_install_is_patched_at_install(fake_vllm_ascend):
    write_fake_vllm_ascend(fake_vllm_ascend)
    attention_cp = import_caller()
    assert not is_patched(attention_cp)
    apply_patches()
    assert is_patched(attention_cp)
    vllm_ascend_cp.uninstall()
    assert attention_cp.forward_decode(None, None, 8) == "original"
    impl = attention_cp.AscendAttentionCPImpl
    assert impl()._compute_prefill_context(None, None, None) == "original"
    assert not hasattr(impl._compute_prefill_context, "__wrapped__")
    assert vllm_ascend_cp.WRAPPED_MARKER not in vars(impl)


def test_switch_off_leaves_vllm_ascend_alone(fake_vllm_ascend, monkeypatch):
    write_fake_vllm_ascend(fake_vllm_ascend)
    monkeypatch.setenv(envs.CP_PATCH.name, "0")
    assert apply_patches() == []
    assert not is_patched(import_caller())


def test_changed_target_is_left_alone_with_a_warning(fake_vllm_ascend, caplog):
    write_fake_vllm_ascend(fake_vllm_ascend, update_params="head_dim, buffer")
    apply_patches()
    with caplog.at_level(logging.WARNING, logger=vllm_ascend_cp.__name__):
        attention_cp = import_caller()
    assert not is_patched(attention_cp)
    assert attention_cp.forward_decode(None, None, 8) == "original"
    assert any("not applied" in r.message and "head_dim" in r.message for r in caplog.records)


# --- the sdist check script ------------------------------------------------------------


def test_check_script_passes_on_the_sdist(capsys):
    assert check_script.main([str(find_or_download_sdist())]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["ok"] and summary["failed"] == {} and summary["checks"] >= 5


CALLER_PATH = check_script.module_path(vllm_ascend_cp.CALLER_MODULES[0])
BACKEND_PATH = "vllm_ascend/attention/attention_v1.py"
COMMON_IMPORT = (
    "from vllm_ascend.attention.context_parallel.common_cp import AscendMetadataForDecode"
)
MUTATIONS = {
    "another module uses a target": (
        BACKEND_PATH,
        COMMON_IMPORT,
        COMMON_IMPORT.replace("AscendMetadataForDecode", "_npu_attention_update"),
    ),
    "caller imported eagerly": (
        BACKEND_PATH,
        COMMON_IMPORT,
        f"import {vllm_ascend_cp.CALLER_MODULES[0]}\n{COMMON_IMPORT}",
    ),
    "pair broken": (
        CALLER_PATH,
        "attn_out = _npu_attention_update(self.head_size, attn_out_lse)",
        "attn_out = _npu_attention_update(self.head_size, attn_out)",
    ),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_check_script_notices_changed_targets(sources, mutation):
    path, old, new = MUTATIONS[mutation]
    assert old in sources[path]
    changed = {**sources, path: sources[path].replace(old, new)}
    failed = [name for name, problem in check_script.run_checks(changed).items() if problem]
    assert failed


def test_a_target_whose_source_is_not_pinned_is_refused(
    fake_vllm_ascend, monkeypatch, refusal_log
):
    """Fail closed: a caller whose pair is not the source the patch was verified on (and not
    accepted) stays vllm-ascend's, and the warning names the function and the variable."""
    monkeypatch.delenv(envs.ACCEPT_PATCH_SOURCES.name)
    write_fake_vllm_ascend(fake_vllm_ascend)
    apply_patches()
    attention_cp = import_caller()
    assert not is_patched(attention_cp)
    assert attention_cp.forward_decode(None, None, 8) == "original"
    refused = [r.getMessage() for r in refusal_log.records if "not applied" in r.getMessage()]
    assert any(f"{vllm_ascend_cp.COMMON_MODULE}:_process_attn_out_lse" in m for m in refused)
    assert all(envs.ACCEPT_PATCH_SOURCES.name in m for m in refused)
