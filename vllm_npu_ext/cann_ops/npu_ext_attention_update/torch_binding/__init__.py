"""Torch-side bindings of NpuExtAttentionUpdate: the C++ PrivateUse1 kernel (built by setup.py
into `vllm_npu_ext._cann_C`) and the torchair converter (`torchair_converter`)."""
