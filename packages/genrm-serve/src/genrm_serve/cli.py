"""Command line of the judge service (filled by the genrm-serve issue)."""


def main() -> None:
    raise SystemExit("genrm-serve: not implemented yet")
