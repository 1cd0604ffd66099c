"""Helpers the tests share: subprocess workers, oracles and probes (not part of the package)."""
