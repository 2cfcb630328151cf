"""Data helpers shared by the adapters and examples: one shard rule, and the locally made or bundled example tasks."""
