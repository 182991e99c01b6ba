"""Command line of rl-core (filled by the placement and training issues)."""


def main() -> None:
    raise SystemExit("rl-core: not implemented yet")
