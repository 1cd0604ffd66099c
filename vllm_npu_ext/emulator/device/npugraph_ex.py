"""`npugraph_ex` and `torchair`, Huawei's graph compilers, as `import torch_npu` leaves them.

Importing torch-npu 2.10.0.post4 registers dynamo backends (`torch_npu/_init/registry/dynamo.py`
calls `torch_npu.dynamo._register_backends`), which puts lazy `npugraph_ex` and `torchair` modules
into `sys.modules` (`torch_npu/dynamo/__init__.py`, `_get_default_backend` and
`_get_npugraph_ex_backend`): so `import npugraph_ex` works on any torch_npu host. vllm-ascend
0.23.0.post1's fusion passes import it (`vllm_ascend/compilation/passes/base_pattern.py`, its
module-level `import npugraph_ex as nge`) and register each pattern with it as well as with torch's
pattern matcher (`BasePattern.register`).

The stand-in implements that registration, ported from the wheel's
`dynamo/npugraph_ex/patterns/pattern_pass_manager.py`: `register_replacement` registers the pattern
into npugraph_ex's own `PatternMatcherPass` (its generic pattern pass, which only npugraph_ex's
compiler applies), with the same stream check before the caller's `extra_check`. npugraph_ex's
compiler itself (`CompilerConfig`, `get_npu_backend`, `npu_fx_compiler`, its ACL-graph concrete
graphs: what vllm-ascend's default `enable_npugraph_ex` compile path runs, vllm-ascend 0.23.0.post1
`npugraph_ex_compile` in `vllm_ascend/compilation/compiler_interface.py`) is not emulated, nor is
anything of torchair: those names raise AttributeError naming them.
"""

from __future__ import annotations

import logging
from types import ModuleType

from ..runtime.strict import strict_module

logger = logging.getLogger("npugraph_ex")
_pass_dict = None


def _return_true(match) -> bool:
    return True


def _check_pattern_stream(match) -> bool:
    """A match may not span streams (pattern_pass_manager.py `_check_pattern_stream`)."""
    non_default_streams, has_default = set(), False
    for node in match.nodes:
        if node.op == "call_function":
            stream = node.meta.get("stream_label")
            if stream is None:
                has_default = True
            else:
                non_default_streams.add(stream)
                if len(non_default_streams) > 1:
                    return False
    return not (has_default and non_default_streams)


def pattern_pass():
    """npugraph_ex's generic pattern pass: the patterns registered so far."""
    global _pass_dict
    if _pass_dict is None:
        from torch._inductor.pattern_matcher import PatternMatcherPass

        _pass_dict = PatternMatcherPass(pass_name="npugraph_ex_generic_pattern_pass")
    return _pass_dict


def register_replacement(search_fn, replace_fn, example_inputs, trace_fn=None,
                         extra_check=_return_true, search_fn_pattern=None,
                         scalar_workaround=None, skip_duplicates=False) -> None:  # fmt: skip
    """`npugraph_ex.register_replacement`: torch's `register_replacement` into npugraph_ex's
    pattern pass, the caller's check after the stream check."""
    from torch._inductor import pattern_matcher

    def add_stream_check(match) -> bool:
        return _check_pattern_stream(match) and extra_check(match)

    pattern_matcher.register_replacement(
        search_fn=search_fn, replace_fn=replace_fn, example_inputs=example_inputs,
        trace_fn=trace_fn or pattern_matcher.fwd_only, pass_dicts=pattern_pass(),
        extra_check=add_stream_check, search_fn_pattern=search_fn_pattern,
        scalar_workaround=scalar_workaround, skip_duplicates=skip_duplicates,
    )  # fmt: skip


def modules() -> dict[str, ModuleType]:
    npugraph_ex = strict_module(
        "npugraph_ex", "npugraph_ex (torch_npu.dynamo.npugraph_ex): pattern registration only.",
        register_replacement=register_replacement, logger=logger,
    )  # fmt: skip
    torchair = strict_module("torchair", "torchair (torch_npu.dynamo.torchair): names only.")
    return {"npugraph_ex": npugraph_ex, "torchair": torchair}
