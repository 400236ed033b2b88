"""tbmem's own modules: not part of the public API (docs/api.md); they may change without notice."""

__all__: list[str] = []
