"""The stand-in's operators: torch_npu's (`attention`, `attention_update`, `matmul`, `norm`,
`pointwise`, `quant`, `format_cast`), ATB's (`atb`), vllm-ascend's compiled library
(`vllm_ascend_library`) and Triton kernels (`vllm_ascend_triton`), vLLM's Triton kernels
(`vllm_triton`) and our own CANN operator (`npu_ext_cann`). Each checks its documented
contract, cited next to the code, and computes the documented math in PyTorch. They use the
`runtime`; none knows the device."""
