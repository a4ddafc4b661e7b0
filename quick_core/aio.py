"""The asyncio API: :class:`AsyncQuick` wraps a :class:`~quickzones.client.Quick`.

There is no second implementation of anything here. Every store call runs the threaded
core on a thread (``asyncio.to_thread``), and the async consumer *is* the threaded
:class:`~quickzones.consumer.Consumer`: an ``async def`` handler is registered as a plain
handler that, on the worker thread, submits the coroutine to the caller's event loop
(``asyncio.run_coroutine_threadsafe``) and waits for it. So leases, their extension,
retries, dead letters, nacks, execution bounds and transactional handlers all behave
exactly as for threaded handlers.

aq = AsyncQuick.open("sqlite:///quick.db")

@aq.job("send_email")
async def send_email(payload, ctx):
    await mailer.send(payload["to"])

await aq.enqueue("send_email", {"to": "a@example.com"}, app="mail", tenant="user-1")
async with aq.consumer():
    await stop_requested.wait()

Why the worker thread waits instead of the handler running "natively" on the loop: the
lease extender interrupts a handler whose lease was lost by raising an exception in its
thread, and a transactional handler's transaction belongs to the worker that commits it.
Waiting keeps both true; the wait turns the interrupt into a cancellation of the coroutine.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import queue
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from quickzones.batches import Batch, Chain, Job
from quickzones.client import Quick
from quickzones.clock import Clock
from quickzones.consumer import Consumer, ConsumerConfig
from quickzones.errors import ConfigurationError
from quickzones.registry import Handler, JobContext
from quickzones.store.admin import Requeued
from quickzones.store.batches import BatchStatus
from quickzones.store.kv import KVTransaction
from quickzones.store.outcomes import JobStatus, ResultNotAvailable, ResultWait
from quickzones.store.pages import Page
from quickzones.store.pauses import Pause
from quickzones.store.records import DeadLetter, WorkItem
from quickzones.store.tenant_limits import TenantLimit
from quickzones.store.validation import check_seconds
from quickzones.store.weights import TenantWeight

T = TypeVar("T")
P = ParamSpec("P")

AsyncHandler = Callable[[Any, JobContext], Awaitable[Any]]

# How often a waiting worker thread wakes up. CPython delivers the lease extender's
# asynchronous exception only between bytecodes, so the wait must not be one long C call.
_POLL_S = 0.02
# After cancelling a coroutine, how long its thread waits for the coroutine's own cleanup
# (``finally`` blocks) before it records the outcome anyway.
_CANCEL_GRACE_S = 5.0


class _Caller:
    """A thread blocked on a coroutine; it runs blocking calls the coroutine hands it.

    A transactional handler's ``ctx.tr`` and an ``async`` transaction body's ``tr`` belong
    to this thread (a KV transaction is not thread-safe), so calls that take that ``tr``
    are sent back here rather than to a new thread.
    """

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.finished = threading.Event()


_CALLER: contextvars.ContextVar[_Caller | None] = contextvars.ContextVar(
    "quick_aio_caller", default=None
)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _guarded(coro: Coroutine[Any, Any, T], caller: _Caller) -> T:
    try:
        return await coro
    finally:
        caller.finished.set()
        caller.calls.put(None)  # wake the waiting thread at once


def run_coroutine_blocking(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """Run ``coro`` on ``loop`` (running in another thread) and wait for its result.

    While waiting, this thread runs the blocking calls the coroutine sends it through
    :meth:`AsyncQuick.run_sync`. An exception raised into this thread while it waits
    (a lost lease, an execution bound, a shutdown) cancels the coroutine, waits for its
    cleanup, and propagates, so the core sees it exactly as from a threaded handler.
    """
    if _running_loop() is loop:
        coro.close()
        raise ConfigurationError(
            "an async handler cannot be run from its own event loop's thread; "
            "use `await aq.run_until_idle()` or an async consumer instead"
        )
    caller = _Caller()
    # The coroutine's task copies this thread's context (call_soon_threadsafe captures it),
    # which is how run_sync finds this caller.
    token = _CALLER.set(caller)
    try:
        future = asyncio.run_coroutine_threadsafe(_guarded(coro, caller), loop)
    finally:
        _CALLER.reset(token)
    try:
        while not future.done():
            try:
                call = caller.calls.get(timeout=_POLL_S)
            except queue.Empty:
                if loop.is_closed():
                    raise RuntimeError("the event loop running the handler closed") from None
                continue
            if call is not None:
                call()
        return future.result()
    except BaseException:
        if not future.done():
            future.cancel()  # cancels the task on the loop
            caller.finished.wait(_CANCEL_GRACE_S)
        raise


class _LoopBinding:
    """The event loop that async handlers of one :class:`AsyncQuick` run on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._users = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self._loop is not None and self._loop is not loop and not self._loop.is_closed():
                raise ConfigurationError(
                    "this AsyncQuick already runs consumers on another event loop"
                )
            if self._loop is not loop:
                self._loop, self._users = loop, 0
            self._users += 1

    def unbind(self) -> None:
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users == 0:
                self._loop = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            loop = self._loop
        if loop is not None and not loop.is_closed():
            return run_coroutine_blocking(coro, loop)
        # No async consumer is running: a plain threaded consumer (``quick worker``,
        # ``Quick.run_until_idle``) called the handler. Give it a private loop on this
        # thread; an interrupt still stops it, because asyncio.run runs in this thread.
        if _running_loop() is not None:
            coro.close()
            raise ConfigurationError(
                "an async handler was called on an event loop's thread with no async "
                "consumer running; use `await aq.run_until_idle()`"
            )
        return asyncio.run(coro)


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an async callable object
    )


class AsyncConsumer:
    """The threaded :class:`Consumer`, started and stopped without blocking the loop; its
    async handlers run on the loop that started it."""

    def __init__(self, binding: _LoopBinding, consumer: Consumer) -> None:
        self._binding = binding
        self.consumer = consumer
        self._started = False

    @property
    def name(self) -> str:
        return self.consumer.name

    @property
    def stats(self) -> Any:
        """The consumer's event counters (``stats["completed"]`` and so on)."""
        return self.consumer.stats

    async def start(self) -> None:
        """Bind the running loop for async handlers, then start the consumer's threads."""
        if self._started:
            return
        self._binding.bind(asyncio.get_running_loop())
        try:
            await asyncio.to_thread(self.consumer.start)
        except BaseException:
            self._binding.unbind()
            raise
        self._started = True

    async def stop(self, deadline_s: float | None = None) -> None:
        """Graceful stop (see :meth:`Consumer.stop`); runs on a thread so the handlers it
        waits for can still run on this loop."""
        if not self._started:
            return
        self._started = False
        try:
            await asyncio.to_thread(self.consumer.stop, deadline_s)
        finally:
            self._binding.unbind()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Run until ``stop`` is set or this task is cancelled, then stop gracefully."""
        await self.start()
        try:
            await (stop or asyncio.Event()).wait()
        finally:
            # Shielded: a second cancellation must not leave the threads running.
            await asyncio.shield(self.stop())

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.shield(self.stop())


def _on_store_thread(
    method: Callable[Concatenate[Quick, P], T], *, listed: tuple[str, ...] = ()
) -> Callable[Concatenate[AsyncQuick, P], Coroutine[Any, Any, T]]:
    """``method`` of :class:`Quick` as a coroutine method of :class:`AsyncQuick`, with the
    same parameters (one signature to keep, not two), run by :meth:`AsyncQuick.run_sync`.
    The iterables named in ``listed`` are listed on the loop first: a caller's generator
    never runs on another thread."""
    signature = inspect.signature(method)

    async def call(self: AsyncQuick, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if listed:
            bound = signature.bind(self.quick, *args, **kwargs)
            for name in listed:
                if name in bound.arguments:
                    bound.arguments[name] = list(bound.arguments[name])
            return await self.run_sync(method, *bound.args, **bound.kwargs)
        return await self.run_sync(method, self.quick, *args, **kwargs)

    # Not functools.wraps: its wrapper type is no method to mypy.
    call.__name__ = call.__qualname__ = method.__name__
    call.__doc__ = method.__doc__
    call.__signature__ = signature  # type: ignore[attr-defined]  # help() shows Quick's
    return call


@dataclasses.dataclass(frozen=True, slots=True)
class OnLoop:
    """An application's async connection (a psycopg ``AsyncConnection``) and the event
    loop that drives it, handed to a store's ``transaction_on`` by
    :meth:`AsyncQuick.enqueue_on`: the enqueue runs on a thread, and each statement it
    sends is run on ``loop`` (free meanwhile: it awaits that thread)."""

    connection: object
    loop: asyncio.AbstractEventLoop


class AsyncQuick:
    """A :class:`Quick` for asyncio code: the same store, registry and clock."""

    def __init__(self, quick: Quick) -> None:
        self.quick = quick
        self._binding = _LoopBinding()

    @classmethod
    def open(cls, url: str, *, clock: Clock | None = None, **options: Any) -> AsyncQuick:
        """Open the store a URL names, like :meth:`Quick.open` (opening does no I/O that
        is worth a thread)."""
        return cls(Quick.open(url, clock=clock, **options))

    @property
    def registry(self) -> Any:
        return self.quick.registry

    @property
    def clock(self) -> Clock:
        return self.quick.clock

    async def aclose(self) -> None:
        await asyncio.to_thread(self.quick.close)

    async def __aenter__(self) -> AsyncQuick:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- handlers ----------------------------------------------------------------------

    def job(self, name: str, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``async def handler(payload, ctx)`` (or a plain function) for a job
        type; ``options`` are those of :meth:`Quick.job` (retry, concurrency limits,
        execution bound, transactional, delivery, ttl_s), passed through unchanged.

        The coroutine runs on the event loop of the async consumer that took the item,
        while the worker thread that took it waits; a lost lease or an exceeded execution
        bound cancels it. In a transactional handler ``ctx.tr`` may be used directly, and
        ``await aq.enqueue(..., tr=ctx.tr)`` joins the handler's transaction.
        """
        register = self.quick.job(name, **options)

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            register(self._threaded(fn) if _is_async(fn) else fn)
            return fn

        return decorate

    def _threaded(self, fn: Callable[..., Any]) -> Handler:
        binding = self._binding

        @functools.wraps(fn)
        def handler(payload: Any, ctx: JobContext) -> Any:
            return binding.run(fn(payload, ctx))

        return handler

    # --- blocking calls ------------------------------------------------------------------

    async def run_sync(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking call without blocking the loop.

        Inside an async handler or an async :meth:`transact` body it runs on the thread
        that owns the transaction (so it may use ``tr``); elsewhere on a fresh thread.
        """
        call = functools.partial(fn, *args, **kwargs)
        caller = _CALLER.get()
        if caller is None or caller.finished.is_set():
            return await asyncio.to_thread(call)
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if result.done():  # the awaiting coroutine was cancelled meanwhile
                return
            if ok:
                result.set_result(value)
            else:
                result.set_exception(value)

        def run_there() -> None:
            try:
                value = call()
            except BaseException as err:
                loop.call_soon_threadsafe(settle, False, err)
                if not isinstance(err, Exception):
                    raise  # an interrupt aimed at the waiting thread: it must see it too
                return
            loop.call_soon_threadsafe(settle, True, value)

        caller.calls.put(run_there)
        return await result

    # --- enqueue -----------------------------------------------------------------------

    # :meth:`Quick.enqueue`, same parameters. With ``tr`` (from an async :meth:`transact`
    # body or a transactional handler's ``ctx.tr``) it joins that transaction; it runs on
    # the thread that owns it.
    enqueue = _on_store_thread(Quick.enqueue)

    # :meth:`Quick.enqueue_many` and :meth:`Quick.enqueue_local`, same parameters.
    enqueue_many = _on_store_thread(Quick.enqueue_many, listed=("payloads",))
    enqueue_local = _on_store_thread(Quick.enqueue_local)

    async def transact(
        self, fn: Callable[[KVTransaction], T] | Callable[[KVTransaction], Awaitable[T]]
    ) -> T:
        """:meth:`Quick.transact`: run ``fn(tr)`` in one transaction with retries.

        ``fn`` may be a plain function (it runs on a thread) or an ``async def`` (it runs
        on this loop and is re-run from the start on each retry). Inside it, use
        ``await aq.enqueue(..., tr=tr)`` and ``await aq.run_sync(tr.get, key)``; calling
        ``tr`` directly also works but blocks the loop for the call.
        """
        if not _is_async(fn):
            return await asyncio.to_thread(self.quick.transact, fn)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        make = fn

        def body(tr: KVTransaction) -> T:
            coro = make(tr)
            if not inspect.iscoroutine(coro):
                raise TypeError("an async transaction body must return a coroutine")
            result: T = run_coroutine_blocking(coro, loop)
            return result

        return await asyncio.to_thread(self.quick.transact, body)

    # --- zone operations and admin -------------------------------------------------------

    async def enqueue_on(
        self, connection: object, job_type: str, payload: Any = b"", **options: Any
    ) -> str:
        """:meth:`Quick.enqueue_on` from asyncio code: inside the application's own
        transaction on ``connection``. An async connection (a psycopg ``AsyncConnection``
        on a ``postgresql://`` store) is driven from this event loop while the enqueue
        runs on a thread; a blocking one (sqlite3, psycopg ``Connection``) is used here,
        in this thread, as it belongs to it (a short block of the loop)."""
        if not inspect.iscoroutinefunction(getattr(connection, "execute", None)):
            return self.quick.enqueue_on(connection, job_type, payload, **options)
        on_loop = OnLoop(connection, asyncio.get_running_loop())
        return await asyncio.to_thread(self.quick.enqueue_on, on_loop, job_type, payload, **options)

    async def pause(
        self, app: str | None = None, tenant: str | None = None, job_type: str | None = None
    ) -> Pause:
        """:meth:`Quick.pause`."""
        return await asyncio.to_thread(self.quick.pause, app, tenant, job_type)

    async def resume(
        self, app: str | None = None, tenant: str | None = None, job_type: str | None = None
    ) -> bool:
        """:meth:`Quick.resume`."""
        return await asyncio.to_thread(self.quick.resume, app, tenant, job_type)

    async def paused(self) -> list[Pause]:
        """:meth:`Quick.paused`."""
        return await asyncio.to_thread(self.quick.paused)

    async def pause_page(
        self, app: str | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> Page[Pause]:
        """:meth:`Quick.pause_page`: one page from ``cursor``."""
        return await asyncio.to_thread(
            lambda: self.quick.pause_page(app, limit=limit, cursor=cursor)
        )

    async def enqueue_batch(
        self,
        jobs: Sequence[Job],
        *,
        app: str,
        callback: Job,
        fail_fast: bool = False,
        batch_id: str | None = None,
    ) -> Batch:
        """:meth:`Quick.enqueue_batch`."""
        return await asyncio.to_thread(
            functools.partial(
                self.quick.enqueue_batch,
                jobs,
                app=app,
                callback=callback,
                fail_fast=fail_fast,
                batch_id=batch_id,
            )
        )

    async def chain(self, *steps: Job, app: str) -> Chain:
        """:meth:`Quick.chain`."""
        return await asyncio.to_thread(functools.partial(self.quick.chain, *steps, app=app))

    async def batch_status(self, app: str, batch_id: str) -> BatchStatus | None:
        """:meth:`Quick.batch_status`."""
        return await asyncio.to_thread(self.quick.batch_status, app, batch_id)

    async def set_weight(self, app: str, tenant: str | None, weight: float) -> TenantWeight:
        """:meth:`Quick.set_weight`."""
        return await asyncio.to_thread(self.quick.set_weight, app, tenant, weight)

    async def clear_weight(self, app: str, tenant: str | None) -> bool:
        """:meth:`Quick.clear_weight`."""
        return await asyncio.to_thread(self.quick.clear_weight, app, tenant)

    async def weights(self) -> list[TenantWeight]:
        """:meth:`Quick.weights`."""
        return await asyncio.to_thread(self.quick.weights)

    async def weight_page(
        self, app: str | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> Page[TenantWeight]:
        """:meth:`Quick.weight_page`: one page from ``cursor``."""
        return await asyncio.to_thread(
            lambda: self.quick.weight_page(app, limit=limit, cursor=cursor)
        )

    async def set_tenant_limit(
        self,
        app: str,
        tenant: str,
        job_type: str | None = None,
        *,
        max_running: int | None = None,
        rate: int | None = None,
        per: float = 1.0,
    ) -> TenantLimit:
        """:meth:`Quick.set_tenant_limit`."""
        return await asyncio.to_thread(
            lambda: self.quick.set_tenant_limit(
                app, tenant, job_type, max_running=max_running, rate=rate, per=per
            )
        )

    async def clear_tenant_limit(self, app: str, tenant: str, job_type: str | None = None) -> bool:
        """:meth:`Quick.clear_tenant_limit`."""
        return await asyncio.to_thread(self.quick.clear_tenant_limit, app, tenant, job_type)

    async def tenant_limits(self) -> list[TenantLimit]:
        """:meth:`Quick.tenant_limits`."""
        return await asyncio.to_thread(self.quick.tenant_limits)

    async def tenant_limit_page(
        self, app: str | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> Page[TenantLimit]:
        """:meth:`Quick.tenant_limit_page`: one page from ``cursor``."""
        return await asyncio.to_thread(
            lambda: self.quick.tenant_limit_page(app, limit=limit, cursor=cursor)
        )

    async def get(self, app: str, tenant: str, item_id: str) -> WorkItem | None:
        return await asyncio.to_thread(self.quick.get, app, tenant, item_id)

    async def status(self, app: str, tenant: str, item_id: str) -> JobStatus | None:
        return await asyncio.to_thread(self.quick.status, app, tenant, item_id)

    async def result(
        self, app: str, tenant: str, item_id: str, *, timeout: float = 0.0, poll_s: float = 0.05
    ) -> Any:
        """The item's kept result (:meth:`Quick.result`), waiting up to ``timeout``
        seconds for it to finish; reads again after ``poll_s``, then twice as long each
        time, up to 1 s (a read is one snapshot read, no conflict with anything)."""
        wait = ResultWait(check_seconds("timeout", timeout), first_s=poll_s)
        while True:
            try:
                return await asyncio.to_thread(self.quick.result, app, tenant, item_id)
            except ResultNotAvailable as missing:
                await asyncio.sleep(wait.sleep_after(missing))

    async def cancel(self, app: str, tenant: str, item_id: str) -> None:
        """Delete an item by id, leased or not; ItemNotFound if it is not there."""
        await asyncio.to_thread(self.quick.cancel, app, tenant, item_id)

    async def dead_letters(
        self,
        app: str | None = None,
        tenant: str | None = None,
        *,
        job_type: str | None = None,
        limit: int | None = None,
    ) -> list[DeadLetter]:
        """:meth:`Quick.dead_letters`."""
        return await asyncio.to_thread(
            lambda: self.quick.dead_letters(app, tenant, job_type=job_type, limit=limit)
        )

    async def dead_letter_page(
        self,
        app: str | None = None,
        tenant: str | None = None,
        *,
        job_type: str | None = None,
        item_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page[DeadLetter]:
        """:meth:`Quick.dead_letter_page`: one page from ``cursor``."""
        return await asyncio.to_thread(
            lambda: self.quick.dead_letter_page(
                app, tenant, job_type=job_type, item_id=item_id, limit=limit, cursor=cursor
            )
        )

    async def requeue_dead_letter(self, app: str, tenant: str, item_id: str) -> str:
        return await asyncio.to_thread(self.quick.requeue_dead_letter, app, tenant, item_id)

    async def requeue_dead_letters(
        self,
        app: str | None = None,
        tenant: str | None = None,
        *,
        job_type: str | None = None,
        limit: int | None = None,
    ) -> Requeued:
        """:meth:`Quick.requeue_dead_letters`."""
        return await asyncio.to_thread(
            lambda: self.quick.requeue_dead_letters(app, tenant, job_type=job_type, limit=limit)
        )

    async def purge_dead_letters(
        self,
        app: str | None = None,
        tenant: str | None = None,
        *,
        job_type: str | None = None,
        limit: int | None = None,
    ) -> int:
        """Delete exactly the dead letters :meth:`dead_letters` lists with the same filters."""
        return await asyncio.to_thread(
            lambda: self.quick.purge_dead_letters(app, tenant, job_type=job_type, limit=limit)
        )

    # --- consumers ---------------------------------------------------------------------

    def consumer(self, config: ConsumerConfig | None = None, **options: Any) -> AsyncConsumer:
        """An async consumer: ``async with aq.consumer(config): ...`` runs it for the
        block, with a graceful stop at its end. ``options`` are those of
        :meth:`Quick.consumer` (election, observer, name, ...)."""
        return AsyncConsumer(self._binding, self.quick.consumer(config, **options))

    async def run_consumer(
        self,
        config: ConsumerConfig | None = None,
        *,
        stop: asyncio.Event | None = None,
        install_signals: bool = False,
        **options: Any,
    ) -> None:
        """Run a consumer until ``stop`` is set, the task is cancelled, or (with
        ``install_signals``) SIGTERM/SIGINT arrives; then shut down gracefully.
        ``options`` are those of :meth:`Quick.consumer`."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
        try:
            await self.consumer(config, **options).run(stop)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def run_until_idle(self, config: ConsumerConfig | None = None) -> int:
        """Drain every vested item (in one worker thread, async handlers on this loop);
        returns the number of items run. For tests and scripts."""
        self._binding.bind(asyncio.get_running_loop())
        try:
            return await asyncio.to_thread(self.quick.run_until_idle, config)
        finally:
            self._binding.unbind()


__all__ = ["AsyncConsumer", "AsyncHandler", "AsyncQuick", "run_coroutine_blocking"]
