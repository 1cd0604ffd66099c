from vllm_npu_ext.ops.attention_merge import attention_update

__all__ = ["attention_update"]
