from vllm_npu_ext.ops.attention_update import attention_update

__all__ = ["attention_update"]
