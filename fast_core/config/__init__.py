"""The run configuration: one value, read once (from the command line or the environment) and passed down."""
