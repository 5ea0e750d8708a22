"""after_send: work parked until a round stream wrote its next request runs once, in the
order it was parked, by whichever thread comes first; a failure never reaches the sender."""

import threading

from specdec.serving import after_send


def test_parked_work_runs_once_in_order_when_a_request_is_sent():
    ran = []
    first = after_send.park(lambda: ran.append(1))
    after_send.park(lambda: ran.append(2))
    after_send.request_sent()
    after_send.request_sent()
    first()  # the engine thread's safe point, after the sender ran it: nothing more
    assert ran == [1, 2] and first.done


def test_the_engine_thread_may_run_it_first_and_the_sender_then_skips_it():
    ran = []
    once = after_send.park(lambda: ran.append("engine"))
    once()
    after_send.request_sent()
    assert ran == ["engine"]


def test_a_caller_that_comes_while_it_runs_waits_until_it_ran():
    started, release, order = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        release.wait(5)
        order.append("hand-over")

    once = after_send.park(slow)
    sender = threading.Thread(target=after_send.request_sent)
    sender.start()
    started.wait(5)
    engine = threading.Thread(target=lambda: (once(), order.append("engine goes on")))
    engine.start()
    release.set()
    sender.join(5)
    engine.join(5)
    assert order == ["hand-over", "engine goes on"]


def test_a_failing_hand_over_does_not_reach_the_sender_and_the_rest_still_runs():
    ran = []
    after_send.park(lambda: 1 / 0)
    after_send.park(lambda: ran.append("next"))
    after_send.request_sent()  # no exception: gRPC's request iterator must not fail
    assert ran == ["next"]


def test_work_its_engine_thread_ran_is_not_kept_until_the_next_request():
    done = after_send.park(lambda: None)
    done()
    after_send.park(lambda: None)
    assert done not in after_send._parked
    after_send.request_sent()
