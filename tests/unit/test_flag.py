"""consumer.flag.Flag: a threading.Event made only when waited on (issue 29 point 3: two
Events per item were a tenth of a no-op worker's CPU outside the store). It must keep
Event's meaning: a set before the wait, or during it from another thread, is seen."""

from __future__ import annotations

import threading

from quickzones.consumer.flag import Flag


def test_a_flag_set_before_the_wait_is_seen_at_once() -> None:
    flag = Flag()
    assert not flag.is_set()
    flag.set()
    assert flag.is_set()
    assert flag.wait(0)


def test_a_wait_times_out_unset_and_is_woken_by_a_set_from_another_thread() -> None:
    flag = Flag()
    assert flag.wait(0.01) is False
    woke: list[bool] = []
    waiting = threading.Thread(target=lambda: woke.append(flag.wait(30)))
    waiting.start()
    flag.set()
    waiting.join(30)
    assert woke == [True]


def test_clear_unsets_it_for_later_waits() -> None:
    flag = Flag()
    flag.set()
    flag.clear()
    assert not flag.is_set()
    assert flag.wait(0.01) is False


def test_many_waiters_racing_one_set_are_all_woken() -> None:
    for _ in range(50):
        flag = Flag()
        woke: list[bool] = []
        threads = [
            threading.Thread(target=lambda f=flag, w=woke: w.append(f.wait(30))) for _ in range(4)
        ]
        for t in threads:
            t.start()
        flag.set()
        for t in threads:
            t.join(30)
        assert woke == [True] * 4
