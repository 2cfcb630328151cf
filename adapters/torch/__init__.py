"""FAST adapter for torch: not implemented yet (see the project issues)."""
