"""Failed logins: when to refuse one before its password is checked, and when to make
one wait its turn (see `LoginLimiter`)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from assay.master.errors import RateLimitedError

Clock = Callable[[], dt.datetime]
_MAX_USERNAME = 128  # the users.username column
_MAX_PACE_LEVEL = 16  # first_pace * 2**16 is past any max_pace worth setting


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class _Strikes:
    failures: deque[dt.datetime] = field(default_factory=deque)  # within the window
    level: int = 0  # lockouts so far: the next one lasts first_delay * 2**level
    blocked_until: dt.datetime | None = None
    in_flight: int = 0


class _Table(OrderedDict[str, _Strikes]):
    """Strikes by key, least recently used first, with the failures that lock a key."""

    def __init__(self, max_failures: int) -> None:
        super().__init__()
        self.max_failures = max_failures


class LoginAttempt:
    """One login attempt; say how it went before the `attempt` block ends."""

    def __init__(self) -> None:
        self.result: bool | None = None

    def succeeded(self) -> None:
        self.result = True

    def failed(self) -> None:
        self.result = False


class LoginLimiter:
    """Refuses logins after repeated failures, fairly to users behind one address (a NAT)
    and against guesses spread over many addresses.

    Three counts, each over `window`:
    - a user name from one address: `max_failures` (5) lock that pair;
    - one address, at any user names: `address_failures` (50) lock the address, so one
      address cannot guess at every account, while the colleagues behind the same NAT
      are not locked out by someone else's five typos;
    - a user name from addresses it has never logged in from: `account_failures` (20)
      lock the name for every such address. Its owner still logs in from an address
      where a login of hers succeeded before (the last `known_addresses` of them), so
      guesses from a thousand addresses neither go unlimited nor lock her out.
    A lock lasts `first_delay`; each further failure before the key has been quiet for
    `max_delay` doubles it, up to `max_delay`. Attempts are refused before the password
    is checked, so an attacker spends no scrypt time and learns nothing from timing. A
    success clears its user name's count at that address only: one working account must
    not reset the count of guesses from an address at others. Each table keeps at most
    `max_keys` keys (the least recently used go first). Thread-safe.

    Spraying (one guess at each of many user names, each from a new address) passes all
    three counts, so a fourth is cluster-wide: past `global_failures` failures within
    `global_window` at all names from all addresses, every attempt of a user name from an
    address where it has not logged in waits its turn. Turns come `first_pace` apart,
    doubling with each further failure up to `max_pace`, until no attempt has failed for
    `global_window`. An attempt waits at most `max_wait` (less than a client's deadline);
    one whose turn is further off is refused at once, with the time to wait. The wait
    happens before the password is checked, in the caller's thread. A user logging in
    from an address where she logged in before (`known_peer` asks the store when this
    process does not remember it) never waits, so spraying is slowed to one guess per
    `max_pace` without locking anyone out.
    """

    def __init__(
        self,
        *,
        max_failures: int = 5,
        address_failures: int = 50,
        account_failures: int = 20,
        known_addresses: int = 32,
        window: dt.timedelta = dt.timedelta(minutes=5),
        first_delay: dt.timedelta = dt.timedelta(seconds=30),
        max_delay: dt.timedelta = dt.timedelta(minutes=15),
        max_keys: int = 10_000,
        clock: Clock = _utcnow,
        global_failures: int = 0,
        global_window: dt.timedelta = dt.timedelta(minutes=1),
        first_pace: dt.timedelta = dt.timedelta(seconds=0.5),
        max_pace: dt.timedelta = dt.timedelta(seconds=8),
        max_wait: dt.timedelta = dt.timedelta(seconds=15),
        known_peer: Callable[[str, str], bool] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`global_failures` 0: no cluster-wide pacing."""
        for name, value in (
            ("max_failures", max_failures),
            ("address_failures", address_failures),
            ("account_failures", account_failures),
            ("known_addresses", known_addresses),
            ("max_keys", max_keys),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if not dt.timedelta(0) < first_delay <= max_delay:
            raise ValueError(
                f"need 0 < first_delay <= max_delay, got {first_delay} and {max_delay}"
            )
        if not dt.timedelta(0) < first_pace <= max_pace <= max_wait:
            raise ValueError(
                "need 0 < first_pace <= max_pace <= max_wait, got "
                f"{first_pace}, {max_pace} and {max_wait}"
            )
        self._window = window
        self._first_delay = first_delay
        self._max_delay = max_delay
        self._max_keys = max_keys
        self._known_per_user = known_addresses
        self._clock = clock
        self._lock = threading.Lock()
        self._users = _Table(max_failures)  # user name + address
        self._peers = _Table(address_failures)  # address
        self._accounts = _Table(account_failures)  # user name, from unknown addresses
        self._known: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()
        self._pace = _Pace(global_failures, global_window, first_pace, max_pace, max_wait)
        self._known_peer = known_peer
        self._sleep = sleep

    @contextmanager
    def attempt(self, username: str, peer: str) -> Iterator[LoginAttempt]:
        """Admit one attempt (or raise `RateLimitedError`), after its turn if logins are
        paced; then record how it went."""
        name, peer = username[:_MAX_USERNAME], peer[:255]
        keys = [(self._users, f"{name}\x00{peer}")]
        if peer:
            keys.append((self._peers, peer))
        known = self._knows(name, peer)
        now = self._clock()
        with self._lock:
            if not known:
                keys.append((self._accounts, name))
            for table, key in keys:
                self._admit(table, table.get(key), now)
            wait = 0.0 if known else self._pace.turn(now)
            for table, key in keys:
                self._strikes(table, key).in_flight += 1
        outcome = LoginAttempt()
        try:
            if wait > 0:
                self._sleep(wait)
            yield outcome
        finally:
            now = self._clock()
            with self._lock:
                if not known:
                    self._pace.ended(now, outcome.result is False)
                elif outcome.result is False:
                    self._pace.failed(now)
                for table, key in keys:
                    strikes = self._strikes(table, key)
                    strikes.in_flight = max(0, strikes.in_flight - 1)
                    if outcome.result is False:
                        self._fail(table, strikes, now)
                    elif outcome.result and table is self._users:
                        strikes = table[key] = _Strikes(in_flight=strikes.in_flight)
                    if strikes.in_flight == 0 and not strikes.failures and not strikes.level:
                        del table[key]
                    while len(table) > self._max_keys:
                        table.popitem(last=False)
                if outcome.result and peer:
                    self._remember(name, peer)

    def _knows(self, name: str, peer: str) -> bool:
        """Whether `name` has logged in from `peer`: remembered here, or (only when that
        would spare the attempt a lock or a wait) as `known_peer` finds in the store."""
        with self._lock:
            if peer in self._known.get(name, ()):
                return True
            ask = self._known_peer is not None and bool(peer)
            ask = ask and (name in self._accounts or self._pace.on(self._clock()))
        if not ask or self._known_peer is None or not self._known_peer(name, peer):
            return False
        with self._lock:
            self._remember(name, peer)
        return True

    def keys(self) -> tuple[int, int]:
        """How many user names (per address) and addresses are remembered."""
        with self._lock:
            return len(self._users), len(self._peers)

    def _remember(self, name: str, peer: str) -> None:
        known = self._known.setdefault(name, OrderedDict())
        known[peer] = None
        known.move_to_end(peer)
        self._known.move_to_end(name)
        while len(known) > self._known_per_user:
            known.popitem(last=False)
        while len(self._known) > self._max_keys:
            self._known.popitem(last=False)

    def _admit(self, table: _Table, strikes: _Strikes | None, now: dt.datetime) -> None:
        if strikes is None:
            return
        if strikes.blocked_until is not None and now < strikes.blocked_until:
            raise RateLimitedError((strikes.blocked_until - now).total_seconds())
        # Attempts in flight count as failures to come: a burst of parallel guesses
        # must not all be checked before the first one fails.
        self._forgive(strikes, now)
        room = 1 if strikes.level else table.max_failures - len(strikes.failures)
        if strikes.in_flight >= max(1, room):
            raise RateLimitedError(1.0)

    def _fail(self, table: _Table, strikes: _Strikes, now: dt.datetime) -> None:
        self._forgive(strikes, now)
        strikes.failures.append(now)
        if strikes.level or len(strikes.failures) >= table.max_failures:
            delay = min(self._first_delay * 2 ** min(strikes.level, 32), self._max_delay)
            strikes.level += 1
            strikes.blocked_until = now + delay

    def _forgive(self, strikes: _Strikes, now: dt.datetime) -> None:
        if strikes.blocked_until is not None and now >= strikes.blocked_until + self._max_delay:
            strikes.level, strikes.blocked_until = 0, None
            strikes.failures.clear()
        while strikes.failures and now - strikes.failures[0] >= self._window:
            strikes.failures.popleft()

    @staticmethod
    def _strikes(table: _Table, key: str) -> _Strikes:
        strikes = table.get(key)
        if strikes is None:
            strikes = table[key] = _Strikes()
        table.move_to_end(key)
        return strikes


class _Pace:
    """Cluster-wide failures, and the turns of the attempts that wait while there are
    too many (see `LoginLimiter`). Not thread-safe: the limiter's lock guards it."""

    def __init__(
        self,
        failures: int,
        window: dt.timedelta,
        first: dt.timedelta,
        most: dt.timedelta,
        max_wait: dt.timedelta,
    ) -> None:
        self.limit, self.window, self.first, self.most = failures, window, first, most
        self.max_wait = max_wait
        self.failures: deque[dt.datetime] = deque()  # within the window (the newest `limit`)
        self.level = 0  # failures while paced: the turns are first * 2**(level-1) apart
        self.next_turn: dt.datetime | None = None
        # Attempts it has let through and not yet heard the end of: a burst of parallel
        # guesses counts before the first of them fails.
        self.pending = 0

    def on(self, now: dt.datetime) -> bool:
        """Whether attempts from addresses their user name never logged in from wait."""
        if not self.limit:
            return False
        while self.failures and now - self.failures[0] >= self.window:
            self.failures.popleft()
        if not self.failures:
            self.level = 0  # quiet for a whole window: pacing ends
        return self.level > 0 or len(self.failures) + self.pending >= self.limit

    def turn(self, now: dt.datetime) -> float:
        """Seconds the attempt waits for its turn (0 when not paced); `RateLimitedError`
        when its turn is more than `max_wait` away. Call `ended` when it has."""
        if not self.limit:
            return 0.0
        if not self.on(now):
            self.pending += 1
            return 0.0
        turn = now if self.next_turn is None else max(now, self.next_turn)
        if turn - now > self.max_wait:
            raise RateLimitedError((turn - now - self.max_wait).total_seconds())
        self.next_turn = turn + self._gap()
        self.pending += 1
        return (turn - now).total_seconds()

    def ended(self, now: dt.datetime, failed: bool) -> None:
        """An attempt `turn` let through has ended."""
        if not self.limit:
            return
        self.pending = max(0, self.pending - 1)
        if failed:
            self.failed(now)

    def failed(self, now: dt.datetime) -> None:
        """An attempt failed (one `turn` was not asked about too: a known address's)."""
        if not self.limit:
            return
        self.failures.append(now)
        if len(self.failures) > self.limit:  # the count only needs to reach the limit
            self.failures.popleft()
        if self.on(now):
            self.level = min(self.level + 1, _MAX_PACE_LEVEL)

    def _gap(self) -> dt.timedelta:
        doubled: dt.timedelta = self.first * (1 << max(self.level - 1, 0))
        return min(doubled, self.most)


__all__ = ["LoginAttempt", "LoginLimiter"]
