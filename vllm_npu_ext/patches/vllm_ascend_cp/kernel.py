"""Which AttentionUpdate kernel the patched merges run, settled once per process.

`VLLM_NPU_EXT_ATTENTION_UPDATE_KERNEL` (auto, custom, list) and `_CONTIGUOUS` are read when the
first vllm-ascend module is patched (`ops.attention_update.MergeKernel`); every merge of the
process then uses that choice, captured graphs included. What the masks must do depends on it:
torch_npu's TensorList kernel reads a shard's out where its lse is -inf (the formula taken
literally), our CANN operator and the reference do not (`merge_reads_empty_out`).
"""

from __future__ import annotations

import dataclasses

from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.ops.attention_update import MergeKernel, merge_reads_empty_out

logger = get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """The settled kernel and what it implies for empty shards."""

    kernel: MergeKernel

    @classmethod
    def from_env(cls) -> KernelChoice:
        choice = cls(MergeKernel.from_env())
        logger.info("vllm-npu-ext: CP merge kernel %s", choice.kernel)
        return choice

    def reads_empty_out(self, device) -> bool:
        """Whether the kernel on `device` reads out where lse is -inf (then such rows must be
        0, and rows no rank holds a key of are sent with lse 0: `masks.fill_values`)."""
        return merge_reads_empty_out(self.kernel, device)

    def register_graph_converter(self) -> None:
        """vllm-ascend may compile the decode step with torchair: teach it our operator."""
        from vllm_npu_ext.cann_ops import binding

        if binding.register_graph_converter():
            logger.info("vllm-npu-ext: torchair converter for NpuExtAttentionUpdate registered")
