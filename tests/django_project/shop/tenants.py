"""A tenant chosen by a callable (the backend's ``tenant`` option) instead of a keyword."""

from typing import Any


def from_order(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return "odd" if args[0] % 2 else "even"
