"""The cluster-wide pace of logins (`LoginLimiter(global_failures=...)`), on a fake clock:
past the failures a minute, attempts from addresses their user name never logged in from
wait turns that double up to the most, one whose turn is too far off is refused at once,
and a user at an address she used before never waits."""

from __future__ import annotations

import datetime as dt

import pytest

from assay.master.auth import LoginLimiter
from assay.master.errors import RateLimitedError
from tests.master.test_auth import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class Waits:
    """The limiter's sleep: records each wait and moves the fake clock by it (unless
    `frozen`: the attempts then wait at once, as concurrent ones do)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.waits: list[float] = []
        self.frozen = False

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if not self.frozen:
            self.clock.advance(seconds=seconds)


def _limiter(
    clock: FakeClock, waits: Waits, known: set[tuple[str, str]] | None = None
) -> LoginLimiter:
    return LoginLimiter(
        clock=clock,
        sleep=waits,
        global_failures=10,
        known_peer=(lambda name, peer: (name, peer) in known) if known is not None else None,
    )


def _guess(limiter: LoginLimiter, n: int) -> None:
    """One failed guess at a new user name from a new address."""
    with limiter.attempt(f"user{n}", f"10.1.{n // 250}.{n % 250}") as attempt:
        attempt.failed()


def _login(limiter: LoginLimiter, name: str, peer: str) -> None:
    with limiter.attempt(name, peer) as attempt:
        attempt.succeeded()


def test_a_spray_is_paced_by_doubling_turns(clock: FakeClock) -> None:
    waits = Waits(clock)
    limiter = _limiter(clock, waits)
    for n in range(10):  # up to the limit: no wait
        _guess(limiter, n)
    assert waits.waits == []
    for n in range(10, 18):  # one at a time, each after the turn before it
        _guess(limiter, n)
    assert waits.waits == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]  # the 11th went at once
    # Waiting at once: a guess whose turn is more than 15 s away is refused at once,
    # saying when its turn would be near enough.
    waits.frozen = True
    _guess(limiter, 18)
    assert waits.waits[-1] == 8.0
    with pytest.raises(RateLimitedError) as refused:
        _guess(limiter, 19)
    assert refused.value.retry_after_s == pytest.approx(1.0)


def test_a_user_at_an_address_she_used_before_never_waits(clock: FakeClock) -> None:
    waits = Waits(clock)
    limiter = _limiter(clock, waits, known={("bob", "10.0.0.2")})
    _login(limiter, "alice", "10.0.0.1")
    for n in range(14):
        _guess(limiter, n)
    waited = len(waits.waits)
    assert waited == 3
    _login(limiter, "alice", "10.0.0.1")  # remembered here
    _login(limiter, "bob", "10.0.0.2")  # known to the store only (a restarted master)
    with limiter.attempt("alice", "10.0.0.1") as attempt:  # even a typo does not wait
        attempt.failed()
    assert len(waits.waits) == waited
    # From a new address she waits her turn like anyone, and is let in.
    _login(limiter, "alice", "10.7.7.7")
    assert len(waits.waits) == waited + 1


def test_pacing_ends_after_a_quiet_window(clock: FakeClock) -> None:
    waits = Waits(clock)
    limiter = _limiter(clock, waits)
    for n in range(12):
        _guess(limiter, n)
    assert waits.waits == [0.5]
    clock.advance(seconds=61)
    _guess(limiter, 12)
    assert waits.waits == [0.5]


def test_no_pacing_by_default_and_settings_are_checked(clock: FakeClock) -> None:
    waits = Waits(clock)
    limiter = LoginLimiter(clock=clock, sleep=waits)
    for n in range(1000):
        _guess(limiter, n)
    assert waits.waits == []
    with pytest.raises(ValueError, match="first_pace <= max_pace <= max_wait"):
        LoginLimiter(max_pace=dt.timedelta(minutes=1))
