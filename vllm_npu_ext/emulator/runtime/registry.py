"""What every emulated operator shares: registration as a torch operator, the public function,
the CPU-device rule, call counting, the "inside an operator" flag and the test-only
corruption hook.

Each emulated operator is a real torch operator in the `npu` namespace, defined from the
schema strings of the torch-npu wheel (`torch_npu_schemas.json`), exactly as torch_npu
defines its own (its `torch_npu.npu_xxx` is `torch.ops.npu.npu_xxx`, `utils/custom_ops.py`
of the 2.10.0.post4 wheel). The emulator registers a CPU kernel (the contract checks and the
float32 math) and a fake kernel giving the output shapes of the wheel's meta registrations
(`fake.py`). So torch binds every argument, and `torch.compile` traces each call as one
opaque operator, as it does the real ones.

The public function `npu_xxx(...)` first runs, in eager mode only, the emulator's own stricter
binder (`schema.bind`: TypeError naming the argument, host-side int lists instead of tensors,
every tensor on one device: the CPU, or the stand-in's host-backed `npu` device), then calls
`torch.ops.npu.npu_xxx`. Calls are counted and corrupted inside the CPU kernel, so each
execution counts once, eager or compiled (a compiled graph calls the kernel, never the public
function). npu tensors reach that kernel through the device's fallback, as host views.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .fake import FAKE_KERNELS
from .schema import BoundCall, bind, bind_overload, overloads

NAMESPACE = "npu"
# Operator name -> number of calls (every call that reached the operator's kernel, accepted or
# not; calls the binder rejected never reach it).
calls: collections.Counter[str] = collections.Counter()
OPERATORS: dict[str, Callable[..., Any]] = {}
# Operators that launch no device work ("npu::op[.overload]"): host-side sizing and an
# allocation. A captured NPU graph holds no task for them (`device/graphs.py`).
HOST_ONLY: set[str] = set()
_depth = 0
_corruptions: dict[str, Callable[[Any], Any]] = {}


def reset_counts() -> None:
    """Forget every counted call."""
    calls.clear()


def inside_operator() -> bool:
    """True while an emulated operator's CPU kernel runs (its own aten ops are not the caller's)."""
    return _depth > 0


@contextlib.contextmanager
def corrupted(op_name: str, perturb: Callable[[Any], Any]) -> Iterator[None]:
    """While active, operator `op_name` returns `perturb(result)`: for tests that must notice."""
    if op_name not in OPERATORS:
        raise ValueError(f"corrupted(): unknown operator {op_name!r}; known: {sorted(OPERATORS)}")
    previous = _corruptions.get(op_name)
    _corruptions[op_name] = perturb
    try:
        yield
    finally:
        if previous is None:
            _corruptions.pop(op_name, None)
        else:
            _corruptions[op_name] = previous


def emulated_operator(
    op: str, overloads: tuple[str, ...] = ("",), host_only: bool = False
) -> Callable[[Callable[[BoundCall], Any]], Callable[..., Any]]:
    """Register `impl(call: BoundCall)` as the CPU kernel of `torch.ops.npu.<op>` (every schema
    overload; those not in `overloads` raise NotImplementedError) and return the public
    torch_npu-style function `op`. `host_only`: the operator launches no device work."""

    def decorate(impl: Callable[[BoundCall], Any]) -> Callable[..., Any]:
        register_operator(op, impl, overloads)
        if host_only:
            HOST_ONLY.update(f"{NAMESPACE}::{op}" + (f".{o}" if o else "") for o in overloads)
        packet = getattr(getattr(torch.ops, NAMESPACE), op)

        @functools.wraps(impl)
        def operator(*args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling():
                require_one_device(bind(op, args, kwargs))
            return packet(*args, **kwargs)

        operator.__name__ = operator.__qualname__ = op
        del operator.__wrapped__  # the public function is the operator call, not `impl`
        # torch_npu's `npu_xxx` is the packet `torch.ops.npu.npu_xxx`, so callers also name an
        # overload: `torch_npu.npu_fused_infer_attention_score.out(..., out=[...])`.
        for overload in overloads:
            setattr(operator, overload or "default", _overload_call(op, overload, packet))
        OPERATORS[op] = operator
        return operator

    return decorate


def _overload_call(op: str, overload: str, packet: Any) -> Callable[..., Any]:
    """The public call of one overload: the stricter binder against that overload's schema
    (eager only), then torch's `torch.ops.npu.<op>.<overload>`."""
    target = getattr(packet, overload or "default")

    def call(*args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():
            require_one_device(bind_overload(op, overload, args, kwargs))
        return target(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"{op}.{overload or 'default'}"
    return call


@functools.cache
def _library() -> torch.library.Library:
    return torch.library.Library(NAMESPACE, "FRAGMENT")


def register_operator(
    op: str, impl: Callable[[BoundCall], Any], emulated: tuple[str, ...] = ("",)
) -> None:
    """Define `npu::<op>` (every overload in the schema file) with CPU and fake kernels.

    Safe to repeat: what is already registered (by an earlier call, or by a real torch_npu in
    this process) is kept.
    """
    defined = {s.overload_name for s in torch._C._jit_get_schemas_for_operator(f"npu::{op}")}
    for schema in overloads(op):
        overload = schema["overload"]
        name = op + (f".{overload}" if overload else "")
        qualified = f"{NAMESPACE}::{name}"
        if overload not in defined:
            _library().define(schema["schema"])
        if not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CPU"):
            _library().impl(name, _cpu_kernel(op, overload, impl, emulated), "CPU")
        fake = FAKE_KERNELS.get(name)
        if fake is not None and not torch._C._dispatch_has_kernel_for_dispatch_key(
            qualified, "Meta"
        ):
            torch.library.register_fake(qualified, fake, lib=_library())


def _cpu_kernel(op: str, overload: str, impl: Callable[[BoundCall], Any], emulated):
    def kernel(*args: Any, **kwargs: Any) -> Any:
        global _depth
        calls[op] += 1
        _depth += 1
        try:
            if overload not in emulated:
                raise NotImplementedError(
                    f"{op}.{overload} is not emulated (emulated overloads: "
                    f"{[o or 'default' for o in emulated]})"
                )
            result = impl(bind_overload(op, overload, args, kwargs))
        finally:
            _depth -= 1
        perturb = _corruptions.get(op)
        return result if perturb is None else perturb(result)

    kernel.__name__ = f"{op}_cpu_kernel"
    return kernel


# The devices an emulated operator takes: the CPU (the emulated NPU path), or `npu` (the
# stand-in's host-backed device, `host_npu`), whose tensors reach the CPU kernel as CPU
# tensors over the same memory (its fallback) and whose results come back as npu tensors.
DEVICES = ("cpu", "npu")


def require_one_device(call: BoundCall) -> None:
    """ValueError unless every tensor argument lives on one device, the CPU or the stand-in's
    `npu` (as on an NPU, where a host tensor among device tensors is refused)."""
    seen: tuple[str, str] | None = None
    for name, value in call.arguments.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if not isinstance(item, torch.Tensor):
                continue
            kind = item.device.type
            if kind not in DEVICES:
                raise ValueError(
                    f"{call.op}: argument {name!r} is on {item.device}; tensors must be on the "
                    "CPU or the stand-in's npu device, the devices the emulator stands in for"
                )
            if seen is not None and kind != seen[1]:
                raise ValueError(
                    f"{call.op}: argument {name!r} is on {item.device} but {seen[0]!r} is on "
                    f"{seen[1]}; every tensor argument must be on one device"
                )
            seen = seen or (name, kind)
