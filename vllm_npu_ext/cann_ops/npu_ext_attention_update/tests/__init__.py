"""Golden reference and host-side (g++) tests of NpuExtAttentionUpdate."""
