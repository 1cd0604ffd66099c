"""Test and tool support (the torch_npu emulator). Production code never imports this."""
