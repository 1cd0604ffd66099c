"""The stand-in's device: the host-backed `npu` device (`host_npu`), `torch.npu` over it
(`npu`), NPU graph capture and replay (`graphs`), the `hccl` process-group backend
(`collectives`) and npugraph_ex's pattern registration (`npugraph_ex`). Knows no operator."""
