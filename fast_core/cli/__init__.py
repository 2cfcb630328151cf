"""The `fast` command (being written)."""


def main() -> None:
    raise SystemExit("fast: the command line is not written yet")
