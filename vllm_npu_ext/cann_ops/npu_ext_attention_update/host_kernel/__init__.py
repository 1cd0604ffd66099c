"""NpuExtAttentionUpdate's AscendC kernel source, compiled with g++ and run on the host.

`shim/` stands in for the AscendC API subset the kernel calls (kernel_operator.h) and the CANN
host API subset op_host's tiling uses, each call following and checking its documented rules;
`launch.cpp` runs op_host's tiling and then the kernel on every simulated vector core;
`build.py` compiles both with the unchanged op_kernel/ and op_host/ sources into a cached
shared library; `library.py` calls it from Python, which is how the operator runs on a CPU.
"""
