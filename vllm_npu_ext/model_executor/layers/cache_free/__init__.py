"""Attention without a KV cache for pooling runs: the vLLM attention backend (`backend`), the
attention op at which vLLM splits its graphs (`op`), and that op captured in one graph per
forward and updated after each replay (`full_graph`)."""
