"""What the adapters share to look like other libraries: Horovod's names and semantics, and collectives over nested
arrays."""
