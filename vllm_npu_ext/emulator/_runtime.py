"""What every emulated operator shares: schema binding, the CPU-device rule, call counting,
the "inside an operator" flag and the test-only corruption hook."""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._schema import BoundCall, bind

# Operator name -> number of calls (every call that reached the operator, accepted or not).
calls: collections.Counter[str] = collections.Counter()
OPERATORS: dict[str, Callable[..., Any]] = {}
_depth = 0
_corruptions: dict[str, Callable[[Any], Any]] = {}


def reset_counts() -> None:
    """Forget every counted call."""
    calls.clear()


def inside_operator() -> bool:
    """True while an emulated operator runs (its own aten ops are not the caller's)."""
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
    op: str, overloads: tuple[str, ...] = ("",)
) -> Callable[[Callable[[BoundCall], Any]], Callable[..., Any]]:
    """Turn `impl(call: BoundCall)` into the public torch_npu-style function `op`.

    The public function binds its arguments against the schema of `op` (TypeError on a bad
    call), counts the call, checks that every tensor is on the CPU, then runs `impl`.
    """

    def decorate(impl: Callable[[BoundCall], Any]) -> Callable[..., Any]:
        @functools.wraps(impl)
        def operator(*args: Any, **kwargs: Any) -> Any:
            global _depth
            calls[op] += 1
            _depth += 1
            try:
                call = bind(op, args, kwargs)
                if call.overload not in overloads:
                    raise NotImplementedError(
                        f"{op}.{call.overload} is not emulated (emulated overloads: "
                        f"{[o or 'default' for o in overloads]})"
                    )
                require_cpu(call)
                result = impl(call)
            finally:
                _depth -= 1
            perturb = _corruptions.get(op)
            return result if perturb is None else perturb(result)

        operator.__name__ = operator.__qualname__ = op
        OPERATORS[op] = operator
        return operator

    return decorate


def require_cpu(call: BoundCall) -> None:
    """ValueError unless every tensor argument lives on the CPU (the emulated NPU)."""
    for name, value in call.arguments.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, torch.Tensor) and item.device.type != "cpu":
                raise ValueError(
                    f"{call.op}: argument {name!r} is on {item.device}; every tensor must be on "
                    "the CPU, the device the emulator stands in for"
                )
