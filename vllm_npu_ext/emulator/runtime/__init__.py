"""What binds an emulated operator call to its contract: the torch-npu wheel's schemas and
the binder against them (`schema`), the operators' fake kernels (`fake`), registration as torch
operators and call counting (`registry`), the contract checks several operators share
(`checks`) and strict stand-in modules (`strict`). Imports no operator and no device."""
