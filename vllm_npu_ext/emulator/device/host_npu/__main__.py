"""`python -m vllm_npu_ext.emulator.device.host_npu`: build the stand-in's npu device for this
torch."""

from vllm_npu_ext.emulator.device.host_npu import build

print(build.build())
