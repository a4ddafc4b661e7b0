"""``python -m bench.pg_enqueue_cost [options]``: :mod:`bench.enqueue_cost` on PostgreSQL
(``--store postgres``), the name the docs' earlier figures cite; options as there."""

from __future__ import annotations

import sys

from bench.enqueue_cost import OPERATIONS
from bench.enqueue_cost import main as _main

__all__ = ["OPERATIONS", "main"]


def main(argv: list[str] | None = None) -> int:
    return _main(["--store", "postgres", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
