"""Functional ops, one family per module, each with its torch_npu path and a PyTorch reference
of the same signature; `dispatch` decides which one a tensor takes."""
