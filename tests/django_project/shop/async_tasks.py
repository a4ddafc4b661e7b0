"""An ``async def`` task: the worker runs it to completion on its thread."""

import asyncio

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django before 6: the reference implementation
    from django_tasks import task


@task
async def total(a: int, b: int, *, customer: str) -> int:
    await asyncio.sleep(0)
    return a + b
