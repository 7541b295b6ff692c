"""Tools for users' own models: :func:`fastmodule.audit` (what a model silently does
not register) and :func:`fastmodule.check` (exact parity with stock, and the speedup)."""
