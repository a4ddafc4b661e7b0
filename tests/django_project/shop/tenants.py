"""The backend's ``tenant`` option: a callable (task, args, kwargs) -> tenant."""

from typing import Any


def customer(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The shop's tasks name their tenant in the ``customer`` keyword."""
    return str(kwargs["customer"])


def from_order(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return "odd" if args[0] % 2 else "even"
