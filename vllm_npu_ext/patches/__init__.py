"""Patches of other packages, one small module each (placeholder until the CP patch lands)."""


def apply_patches() -> list[str]:
    return []
