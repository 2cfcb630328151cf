"""The model as FAST sees it: one flat NumPy buffer (``FlatLayout``), the adapter contract a framework implements,
in-place mixing, and a NumPy model for tests and examples."""
