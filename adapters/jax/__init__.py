"""FAST adapter for jax: not implemented yet (see the project issues)."""
