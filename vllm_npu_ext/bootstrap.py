"""Custom-op search-path ordering (placeholder until the bootstrap lands)."""


def apply() -> list[str]:
    return []


def platform_plugin() -> None:
    apply()
    return None
