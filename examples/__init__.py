"""The examples, installed as ``fast_examples`` so ``fast bench`` and the tests can run them from any directory."""
