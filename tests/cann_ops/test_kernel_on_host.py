"""Our AscendC kernel source, run on the host: op_host's tiling and op_kernel/'s kernel compiled
with g++ against the AscendC shim (vllm_npu_ext/cann_ops/npu_ext_attention_update/host_kernel)
and launched on every simulated vector core, against the float64 golden reference.

- The grid: every sp in 1..16 and every D in 8..512 (multiples of 8), in fp32, fp16 and bf16,
  with empty shards (lse -inf over NaN/inf partial outputs), rows without keys, strided
  inputs, 1..48 cores and UB sizes from one-row tiles to 192 KiB (several tiles per core,
  tail tiles), update_type 0 and 1.
- The same kernel against vLLM's `_lse_weighted_combine`.
- Mutation proof: a copy of op_kernel/ with one line of the kernel class broken builds, and
  the parity check fails on it (a wrong result, or a broken AscendC rule the shim enforces)
  where the original passes.
"""

from __future__ import annotations

import dataclasses
import random
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from support.host_kernel import without_compiler
from support.vllm_reference import lse_weighted_combine as _lse_weighted_combine

from vllm_npu_ext.cann_ops.npu_ext_attention_update.host_kernel import build, library
from vllm_npu_ext.cann_ops.npu_ext_attention_update.tests import golden
from vllm_npu_ext.emulator.operators import npu_ext_cann as emulated_cann_ops
from vllm_npu_ext.selfcheck.tolerances import op_tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEAD_DIMS = list(range(8, 513, 8))
CORE_COUNTS = (1, 2, 3, 8, 40, 48)
TILE_ROWS = (1, 2, 3, 5, None)  # None: the 910B's 192 KiB UB, else a UB for this many rows
OPERATOR = "npu_ext_attention_update"


@dataclasses.dataclass(frozen=True)
class Case:
    sp: int
    rows: int
    head_dim: int
    dtype: torch.dtype
    update_type: int = 1
    cores: int = library.CORE_NUM_910B
    tile_rows: int | None = None
    strided: bool = False
    seed: int = 0


@pytest.fixture(scope="module")
def kernel() -> library.HostKernel:
    return library.default_kernel()


def make_inputs(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """lse fp32 `[sp, N]` (about a quarter of the shards empty, one row with no keys at all),
    go `[sp, N, D]` with NaN/inf where a shard is empty; strided: views of one buffer."""
    generator = torch.Generator().manual_seed(case.seed)
    sp, rows, head_dim = case.sp, case.rows, case.head_dim
    buffer = torch.randn(sp, rows, head_dim + 1, generator=generator)
    buffer[..., head_dim] *= 4
    empty = torch.rand(sp, rows, generator=generator) < 0.25
    if rows > 2:
        empty[:, rows // 2] = True
    buffer[..., head_dim][empty] = float("-inf")
    garbage = torch.where(torch.rand(sp, rows, 1, generator=generator) < 0.5, float("nan"),
                          float("inf"))  # fmt: skip
    buffer[..., :head_dim] = torch.where(empty[..., None], garbage, buffer[..., :head_dim])
    if case.strided:
        return buffer[..., head_dim], buffer.to(case.dtype)[..., :head_dim]
    return buffer[..., head_dim].contiguous(), buffer[..., :head_dim].to(case.dtype).contiguous()


def ub_bytes(kernel: library.HostKernel, case: Case) -> int:
    if case.tile_rows is None:
        return library.UB_BYTES_910B
    element = torch.empty(0, dtype=case.dtype).element_size()
    return kernel.ub_bytes_of_tile(case.sp, case.head_dim, element, case.tile_rows) + case.seed % 31


def run_case(kernel: library.HostKernel, case: Case) -> tuple[library.LaunchInfo | None, str]:
    """Launch `case` and compare with the golden reference: (launch info, '' or the failure)."""
    lse, go = make_inputs(case)
    try:
        out, lse_out, info = kernel.launch(lse, go, case.update_type, case.cores,
                                           ub_bytes(kernel, case))  # fmt: skip
    except library.KernelRuleViolation as error:
        return None, f"{case}: {error}"
    ref_out, ref_lse = golden.npu_ext_attention_update_golden(
        lse.numpy(), go.float().numpy(), case.update_type
    )
    tol = op_tolerance(OPERATOR, case.dtype)
    if not torch.allclose(out.double(), torch.from_numpy(ref_out), rtol=tol.rtol, atol=tol.atol):
        error = (out.double() - torch.from_numpy(ref_out)).abs().nan_to_num(float("inf")).max()
        return info, f"{case}: out mismatch, max error {error.item():.3g}"
    if case.update_type == 1 and not torch.allclose(
        lse_out.double(), torch.from_numpy(ref_lse), rtol=1e-6, atol=1e-5
    ):
        return info, f"{case}: lse_out mismatch"
    if case.update_type == 0 and not lse_out.isnan().all():
        return info, f"{case}: lse_out written for update_type 0"
    return info, ""


def grid_cases(dtype: torch.dtype) -> list[Case]:
    """Every D twice and every sp eight times (with two different sp per D), random rest."""
    rng = random.Random(str(dtype))
    cases = []
    for i in range(2 * len(HEAD_DIMS)):
        cases.append(Case(
            sp=(7 * i + i // len(HEAD_DIMS)) % 16 + 1, rows=rng.randint(1, 48),
            head_dim=HEAD_DIMS[i % len(HEAD_DIMS)], dtype=dtype, update_type=i % 2,
            cores=rng.choice(CORE_COUNTS), tile_rows=rng.choice(TILE_ROWS), strided=i % 3 == 0,
            seed=i,
        ))  # fmt: skip
    return cases


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_golden_over_every_sp_and_head_dim(kernel, dtype):
    cases = grid_cases(dtype)
    assert {c.sp for c in cases} == set(range(1, 17))
    assert {c.head_dim for c in cases} == set(HEAD_DIMS)
    results = [run_case(kernel, case) for case in cases]
    failures = [failure for _, failure in results if failure]
    assert not failures, f"{len(failures)} of {len(cases)} failed: {failures[:3]}"
    infos = [info for info, _ in results]
    # What the grid claims to exercise, as the launches report it.
    assert sum(info.short_out_copies > 0 for info in infos) > 20  # tail tiles
    assert sum(info.out_copies > 2 * info.block_dim for info in infos) > 20  # 3+ tiles a core
    assert sum(info.block_dim > 1 and info.tiling["formerNum"] > 0 for info in infos) > 20
    assert {info.tiling_key for info in infos} == {DTYPES.index(dtype) + 1}
    for info, case in zip(infos, cases, strict=True):
        assert info.ub_peak_bytes <= ub_bytes(kernel, case)


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_vllm_lse_weighted_combine(kernel, dtype, return_lse):
    sp, batch, heads, head_dim = 4, 5, 3, 32
    case = Case(sp, batch * heads, head_dim, dtype, cores=3, tile_rows=2, strided=True, seed=3)
    lse, go = make_inputs(case)
    out, lse_out, _ = kernel.launch(lse, go, 1, case.cores, ub_bytes(kernel, case))
    expected = _lse_weighted_combine(
        go.float().reshape(sp, batch, heads, head_dim), lse.reshape(sp, batch, heads),
        return_lse=return_lse,
    )  # fmt: skip
    if return_lse:
        expected, expected_lse = expected
        torch.testing.assert_close(lse_out.view(batch, heads), expected_lse, rtol=1e-6, atol=1e-5)
    tol = op_tolerance(OPERATOR, dtype)
    torch.testing.assert_close(out.float().view(batch, heads, head_dim), expected,
                               rtol=tol.rtol, atol=tol.atol)  # fmt: skip


def test_rows_without_keys_and_huge_lse_merge_like_the_reference(kernel):
    lse = torch.tensor([[1000.0, -1000.0, float("-inf")], [1001.0, -1001.0, float("-inf")]])
    go = torch.stack([torch.ones(3, 8), 3 * torch.ones(3, 8)])
    go[:, 2] = float("nan")
    out, lse_out, _ = kernel.launch(lse, go, 1)
    weight = 1 / (1 + torch.exp(torch.tensor(-1.0)))  # shard 1 of row 0
    torch.testing.assert_close(out[0], (1 + 2 * weight) * torch.ones(8))
    assert torch.equal(out[2], torch.zeros(8)) and lse_out[2] == float("-inf")
    torch.testing.assert_close(lse_out[:2], torch.logsumexp(lse[:, :2], dim=0))


def test_no_rows_launch_nothing(kernel):
    out, lse_out, info = kernel.launch(torch.empty(3, 0), torch.empty(3, 0, 16), 1)
    assert out.shape == (0, 16) and lse_out.shape == (0,) and info.block_dim == 0


def test_without_a_compiler_the_emulated_op_fails_naming_it(monkeypatch):
    lse, go = make_inputs(Case(2, 4, 8, torch.float32))
    with (
        without_compiler(monkeypatch) as missing,
        emulated_cann_ops.emulated(),
        pytest.raises(build.CompilerMissing, match=f"{missing}.*C\\+\\+17 compiler"),
    ):
        torch.ops.npu_ext_cann.npu_ext_attention_update(lse, go, 1)


def test_op_host_tiling_refuses_shapes_outside_the_operator_limits(kernel):
    f32 = torch.float32
    assert kernel.tiling(16, 8, 512, f32, 1) is not None
    assert kernel.tiling(17, 8, 128, f32, 0) is None  # sp
    assert kernel.tiling(2, 8, 12, f32, 0) is None  # D not a multiple of 8
    assert kernel.tiling(2, 2**31, 128, f32, 0) is None  # N past the 32-bit row limit
    assert kernel.tiling(2, 8, 128, f32, 2) is None  # update_type
    assert kernel.tiling(16, 8, 512, f32, 0, ub_bytes=4096) is None  # one row does not fit
    assert kernel.tiling(2, 8, 128, f32, 0, core_num=0) is None  # no vector core


# ---- mutation proof: the checks catch a broken kernel ----

KERNEL_CLASS = build.KERNEL_DIR / build.KERNEL_CLASS
MUTATIONS = {  # name: (line of the kernel class, its broken form, what the check reports)
    "go shard offset": ("goGm_[GoGmOffset(tiling_, shard, coreStart_, progress)]",
                        "goGm_[GoGmOffset(tiling_, 0, coreStart_, progress)]", "out mismatch"),
    "exp argument": ("Exp(weights[at], weights[at], lanes);", "Exp(weights[at], lse[at], lanes);",
                     "lse_out mismatch"),
    "tail tile length": (
        "const uint32_t rows = RowsOfTile(coreRows_, tiling_.tileLength, progress);",
        "const uint32_t rows = tiling_.tileLength;", "written 2 times|past the end"),
    "zero-weight guard": ("if (scale > 0.0f) {", "if (scale >= 0.0f) {", "out mismatch"),
    "lse tensor never freed": ("lseInQueue_.FreeTensor(lseLocal);", "",
                               "AllocTensor: every buffer of the queue"),
    "out EnQue dropped": ("outQueue_.EnQue(outLocal);", "", "DeQue of an empty queue"),
    "go buffer halved": ("pipe_.InitBuffer(goInQueue_, kBufferNum, bytes.goIn);",
                         "pipe_.InitBuffer(goInQueue_, kBufferNum, bytes.goIn / 2);",
                         "overruns the tensor|past the tensor"),
}  # fmt: skip
# Several shards, empty ones over NaN, lse_out, three or more tiles per core and tail tiles.
MUTATION_CASES = [
    Case(4, 37, 32, torch.float32, cores=3, tile_rows=4, seed=1),
    Case(3, 29, 64, torch.bfloat16, cores=2, tile_rows=3, strided=True, seed=2),
]


def _kernel_dir_copy(root, mutation=None):
    kernel_dir = root / "op_kernel"
    shutil.copytree(build.KERNEL_DIR, kernel_dir)
    if mutation is not None:
        original, broken, _ = MUTATIONS[mutation]
        text = KERNEL_CLASS.read_text()
        assert text.count(original) == 1, mutation
        (kernel_dir / build.KERNEL_CLASS).write_text(text.replace(original, broken))
    return kernel_dir


@pytest.fixture(scope="module")
def mutants(tmp_path_factory, host_kernel_cache) -> dict[str, library.HostKernel]:
    """Every mutant, built two at a time (each recompiles the kernel unit only)."""
    def build_one(name):
        kernel_dir = _kernel_dir_copy(tmp_path_factory.mktemp("mutant"), name)
        return library.HostKernel(build.build_library(kernel_dir, host_kernel_cache))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(MUTATIONS, pool.map(build_one, MUTATIONS), strict=True))


def test_an_unchanged_copy_of_op_kernel_is_the_same_build(kernel, tmp_path, host_kernel_cache):
    assert build.build_library(_kernel_dir_copy(tmp_path), host_kernel_cache) == kernel.path
    assert all(run_case(kernel, case)[1] == "" for case in MUTATION_CASES)


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_parity_check_fails_on_a_broken_kernel(mutants, mutation):
    failures = [run_case(mutants[mutation], case)[1] for case in MUTATION_CASES]
    assert any(failures), f"{mutation}: the broken kernel passed"
    expected = MUTATIONS[mutation][2]
    assert any(re.search(expected, failure) for failure in failures), failures
