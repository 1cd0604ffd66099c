"""Patch: vLLM's and vllm-ascend's model runners let our pooling model compute the prefixes a
step's texts share once, and run the graph of the deduplicated token count.

What it wraps. The runner's `_model_forward`, the one call of the model per step, made inside
the forward context (`vllm/v1/worker/gpu_model_runner.py` `GPUModelRunner._model_forward`,
which vLLM's CPU runner inherits; vllm-ascend's `NPUModelRunner._model_forward` in
`worker/model_runner_v1.py`, with `num_tokens_padded` first). Where the runner's model holds
a `SharedPrefixes` (our cache-free pooling model: `model_executor/shared_prefix.py`), the
wrapper plans the step from what the runner holds on the host and, if a prefix is shared,
runs the model through `SharedPrefixes.forward`; otherwise it calls the runner's method
unchanged.

What it relies on, pinned (`patches/__init__.py`): `_prepare_inputs` fills the host buffers
it reads before the forward (`input_ids.cpu`, `query_start_loc.cpu`, and
`input_batch.num_computed_tokens_cpu`); `_model_forward` is the model's one call and its
arguments are the runner's padded buffers (the graphs' captured inputs); the graph wrappers
(vLLM's `CUDAGraphWrapper.__call__`, vllm-ascend's `ACLGraphWrapper.__call__`) choose the
graph by the forward context's batch descriptor and runtime mode at each call and replay it
with the captured input addresses. A runner class whose pinned sources differ is not wrapped
(fail closed: its steps compute every text whole), logged, and the model shares nothing.

When it applies: when our cache-free pooling model is built (`models/qwen3.py`), in the worker
that holds the runner; `VLLM_NPU_EXT_SHARED_PREFIX=0` turns it off.
"""

from __future__ import annotations

import functools
import inspect
import sys

from vllm_npu_ext import patches
from vllm_npu_ext.model_executor import forward_context

NAME = "vllm_shared_prefix"  # its row in the patch table
METHOD = "_model_forward"
PATCHED_MARKER = "__vllm_npu_ext_shared_prefix__"
VLLM_RUNNER = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
ASCEND_RUNNER = ("vllm_ascend.worker.model_runner_v1", "NPUModelRunner")
CUDA_GRAPH_WRAPPER = "vllm.compilation.cuda_graph:CUDAGraphWrapper.__call__"
ACL_GRAPH_WRAPPER = "vllm_ascend.compilation.acl_graph:ACLGraphWrapper.__call__"
# Per runner: the pinned targets its wrapper relies on (the table's pins).
RUNNER_PINS = {
    VLLM_RUNNER: (
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner._model_forward",
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs",
        CUDA_GRAPH_WRAPPER,
    ),
    ASCEND_RUNNER: (
        "vllm_ascend.worker.model_runner_v1:NPUModelRunner._model_forward",
        "vllm_ascend.worker.model_runner_v1:NPUModelRunner._prepare_inputs",
        ACL_GRAPH_WRAPPER,
    ),
}


def _sharing_of(runner):
    get_model = getattr(runner, "get_model", None)
    model = get_model() if callable(get_model) and hasattr(runner, "model") else None
    return getattr(model, "shared_prefixes", None)


def _step_plan(runner, sharing, arguments: dict):
    """The step's plan, or None: our model's steps of whole token-id prompts only (not the
    runner's warm-up and capture runs, which carry no attention metadata)."""
    if (sharing is None or arguments.get("input_ids") is None
            or not forward_context.has_attention_metadata()
            or forward_context.splits_rows_across_ranks()
            or arguments.get("inputs_embeds") is not None
            or arguments.get("intermediate_tensors") is not None
            or arguments.get("model_kwargs")):  # fmt: skip
        return None
    num_reqs = runner.input_batch.num_reqs
    return sharing.plan(
        runner.input_ids.cpu[: arguments["input_ids"].shape[0]],
        runner.query_start_loc.cpu[: num_reqs + 1],
        runner.input_batch.num_computed_tokens_cpu[:num_reqs],
    )  # fmt: skip


def _wrap(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _model_forward(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        sharing = _sharing_of(self)
        plan = _step_plan(self, sharing, bound.arguments)
        if plan is None:
            return original(*bound.args, **bound.kwargs)

        def run_model(input_ids, positions):
            bound.arguments.update(input_ids=input_ids, positions=positions)
            if "num_tokens_padded" in bound.arguments:  # vllm-ascend's
                bound.arguments["num_tokens_padded"] = input_ids.shape[0]
            return original(*bound.args, **bound.kwargs)

        sizes = list(self.vllm_config.compilation_config.cudagraph_capture_sizes or ())
        arguments = bound.arguments
        return sharing.forward(run_model, plan, arguments["input_ids"], arguments["positions"],
                               sizes)  # fmt: skip

    setattr(_model_forward, PATCHED_MARKER, original)
    return _model_forward


def _wrap_runner(module_name: str, class_name: str) -> str | None:
    """Wrap `class_name._model_forward` where its module is imported; what was done, or None
    where the module is not imported. Refused (logged) where a pin does not match."""
    module = sys.modules.get(module_name)
    runner = getattr(module, class_name, None) if module is not None else None
    if runner is None:
        return None
    current = runner.__dict__.get(METHOD)
    if current is None:
        return f"{class_name} defines no {METHOD}: not wrapped"
    if hasattr(current, PATCHED_MARKER):
        return f"{class_name}.{METHOD} wraps shared prefixes"
    if patches.refusals(NAME, targets=RUNNER_PINS[(module_name, class_name)]):
        return f"{class_name}.{METHOD} is not the source this patch was verified on: not wrapped"
    setattr(runner, METHOD, _wrap(current))
    return f"{class_name}.{METHOD} wraps shared prefixes"


def install() -> list[str]:
    """Wrap every imported runner class (module docstring); one line per class."""
    return [line for line in (_wrap_runner(*VLLM_RUNNER), _wrap_runner(*ASCEND_RUNNER)) if line]


def wrapped(runner_cls: type) -> bool:
    """Whether `runner_cls` (or the class it inherits `_model_forward` from) is wrapped."""
    return hasattr(getattr(runner_cls, METHOD, None), PATCHED_MARKER)


def uninstall() -> None:
    for module_name, class_name in (VLLM_RUNNER, ASCEND_RUNNER):
        runner = getattr(sys.modules.get(module_name), class_name, None)
        method = runner.__dict__.get(METHOD) if runner is not None else None
        if method is not None and hasattr(method, PATCHED_MARKER):
            setattr(runner, METHOD, getattr(method, PATCHED_MARKER))
