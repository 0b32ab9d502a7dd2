"""Failed logins: when to refuse one before its password is checked (see `LoginLimiter`)."""

from __future__ import annotations

import datetime as dt
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from assay.master.errors import RateLimitedError

Clock = Callable[[], dt.datetime]
_MAX_USERNAME = 128  # the users.username column


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
    ) -> None:
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

    @contextmanager
    def attempt(self, username: str, peer: str) -> Iterator[LoginAttempt]:
        """Admit one attempt (or raise `RateLimitedError`), then record how it went."""
        name, peer = username[:_MAX_USERNAME], peer[:255]
        keys = [(self._users, f"{name}\x00{peer}")]
        if peer:
            keys.append((self._peers, peer))
        now = self._clock()
        with self._lock:
            if peer not in self._known.get(name, ()):
                keys.append((self._accounts, name))
            for table, key in keys:
                self._admit(table, table.get(key), now)
            for table, key in keys:
                self._strikes(table, key).in_flight += 1
        outcome = LoginAttempt()
        try:
            yield outcome
        finally:
            now = self._clock()
            with self._lock:
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


__all__ = ["LoginAttempt", "LoginLimiter"]
