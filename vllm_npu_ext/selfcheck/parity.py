"""How one fused operator output is compared with its reference: the numbers every tier reports.

`Parity` holds a fused output (still on the device it was computed on) and the reference
output (on the CPU). `Parity.stats()` gives max abs / max rel error and `worst`, the largest
ratio of an element's error to what the tolerance allows it (`atol + rtol * |reference|`,
torch.isclose's rule): the output passes when `worst <= 1` and shape and dtype agree.
"""

from __future__ import annotations

import dataclasses

import torch

from vllm_npu_ext.selfcheck.tolerances import Tolerance, op_tolerance

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


@dataclasses.dataclass(frozen=True)
class Stats:
    """Error of one output. max_rel only counts elements whose reference exceeds atol."""

    max_abs: float
    max_rel: float
    worst: float
    problem: str | None = None

    @property
    def passed(self) -> bool:
        return self.problem is None and self.worst <= 1.0


def compare(actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance) -> Stats:
    """Stats of `actual` (any device) against `expected` (CPU) under `tolerance`."""
    if actual.shape != expected.shape:
        problem = f"shape {tuple(actual.shape)} != reference {tuple(expected.shape)}"
        return Stats(float("nan"), float("nan"), float("inf"), problem)
    a, e = actual.detach().cpu().float(), expected.detach().float()
    diff = torch.where(a == e, 0.0, (a - e).abs())  # equal infinities count as equal
    if diff.numel() == 0:
        return Stats(0.0, 0.0, 0.0)
    allowed = tolerance.atol + tolerance.rtol * e.abs()
    meaningful = e.abs() > tolerance.atol
    max_rel = (diff[meaningful] / e.abs()[meaningful]).max().item() if meaningful.any() else 0.0
    problem = None
    if actual.dtype != expected.dtype:
        problem = f"dtype {actual.dtype} != reference {expected.dtype}"
    elif not torch.isfinite(diff).all():
        bad = int((~torch.isfinite(diff)).sum())
        problem = f"{bad} NaN/inf elements where the reference differs"
    worst = (diff / allowed).nan_to_num(nan=float("inf")).max().item()
    return Stats(diff.nan_to_num(nan=float("inf")).max().item(), max_rel, worst, problem)


@dataclasses.dataclass(frozen=True)
class Parity:
    """One output of a fused operator next to the reference's.

    operator: the torch_npu (or custom) operator name, which selects the tolerance.
    output: the output's name (e.g. "y", "x_sum"). actual: the fused result as returned, on
    its device. expected: the reference on the CPU, in the dtype the output must have.
    """

    operator: str
    output: str
    actual: torch.Tensor
    expected: torch.Tensor

    @property
    def tolerance(self) -> Tolerance:
        return op_tolerance(self.operator, self.expected.dtype)

    def stats(self) -> Stats:
        return compare(self.actual, self.expected, self.tolerance)

    def assert_close(self) -> None:
        """AssertionError unless the dtypes agree and the values are within the tolerance."""
        assert self.actual.dtype == self.expected.dtype, (
            f"{self.operator} {self.output}: dtype {self.actual.dtype} != {self.expected.dtype}"
        )
        tol = self.tolerance
        torch.testing.assert_close(
            self.actual.cpu().float(), self.expected.float(), atol=tol.atol, rtol=tol.rtol
        )
