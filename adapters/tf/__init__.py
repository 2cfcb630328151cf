"""FAST adapter for tf: not implemented yet (see the project issues)."""
