"""The servers' load spreading and failover policy (``tempering.rollout.balance``), with the
clock in the test's hand: the least loaded server takes a request, a down one none until it
is brought back, probes back off by doubling up to a cap, and the time with none up is
measured from the last one going down."""

from tempering.rollout.balance import ServerPool

A, B, C = "http://a", "http://b", "http://c"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pool(*urls: str, probe_s: float = 1.0, max_probe_s: float = 5.0) -> tuple[ServerPool, Clock]:
    clock = Clock()
    return ServerPool(list(urls), probe_s, max_probe_s, clock), clock


def test_requests_go_to_the_server_with_the_fewest_in_flight():
    pool, _ = _pool(A, B, C)

    assert [pool.acquire() for _ in range(3)] == [A, B, C], "equal loads: in the listed order"
    pool.release(B)
    assert pool.acquire() == B, "B finished its request: it is the least loaded"
    pool.release(A)
    pool.release(C)
    # B is slow: while it holds its request, the least loaded of the others takes each new one
    taken = []
    for _ in range(4):
        taken.append(pool.acquire())
        pool.release(taken[-1])
    assert taken == [A, A, A, A], "A finished each one before the next: still the least loaded"
    assert [pool.acquire(), pool.acquire(), pool.acquire()] == [A, C, A]
    record = pool.record()
    assert (record["server/0/requests"], record["server/1/requests"], record["server/2/requests"]) == (5, 1, 1)


def test_a_down_server_gets_nothing_and_its_request_is_counted_as_resent():
    pool, _ = _pool(A, B)
    first = pool.acquire()
    pool.mark_down(first, "ConnectionRefusedError: [Errno 111]")

    assert [pool.acquire() for _ in range(3)] == [B, B, B]
    record = pool.record()
    assert record["server/0/up"] == 0 and record["server/0/downs"] == 1 and record["server/resent"] == 1
    assert pool.describe_down() == "http://a: ConnectionRefusedError: [Errno 111]"
    pool.mark_down(A, "again", held=False)
    assert pool.record()["server/0/downs"] == 1, "marked down once however many requests find it so"


def test_probes_are_due_after_probe_s_then_back_off_by_doubling_to_the_cap():
    pool, clock = _pool(A, B, probe_s=1.0, max_probe_s=5.0)
    pool.mark_down(A, "timeout", held=False)

    assert pool.due() == []
    waits = []
    for _ in range(4):
        before = clock.now
        while not pool.due():
            clock.now += 0.25
        waits.append(clock.now - before)
        assert pool.claim(A) and not pool.claim(A), "one caller probes at a time"
        assert pool.due() == [], "a claimed probe is not due for others"
        pool.probe_failed(A, "refused")
    assert waits == [1.0, 2.0, 4.0, 5.0]
    clock.now += 5.0
    assert pool.claim(A)
    pool.bring_back(A, version=7)
    assert pool.up() == [A, B] and pool.record()["server/0/returns"] == 1
    assert pool.record()["server/0/version"] == 7
    assert not pool.claim(A), "a server up is not probed"


def test_time_with_no_server_up_counts_from_the_last_one_going_down():
    pool, clock = _pool(A, B)
    pool.mark_down(A, "x", held=False)
    clock.now += 10
    assert pool.all_down_for() is None, "B is up"
    pool.mark_down(B, "y", held=False)
    clock.now += 3
    assert pool.all_down_for() == 3.0
    assert pool.acquire() is None
    assert pool.next_due_in() == 0.0, "A was due for its probe long ago"
    assert pool.claim(A)
    pool.bring_back(A, None)
    assert pool.all_down_for() is None and pool.acquire() == A


def test_each_version_check_is_counted_per_server():
    pool, _ = _pool(A, B)
    for version in (0, 1, 2):
        pool.checked(A, version)
    pool.checked(B, 2)

    record = pool.record()
    assert (record["server/0/checks"], record["server/1/checks"]) == (3, 1)
    assert record["server/0/version"] == record["server/1/version"] == 2
