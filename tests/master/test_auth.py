"""Passwords, sessions, the login limiter and secret masking, on a real SQLite store."""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from sqlalchemy import text

from assay.master.auth import (
    MAX_PASSWORD,
    SCRYPT_N,
    WRONG_LOGIN,
    Authenticator,
    LoginLimiter,
    _auth,
    check_password,
    check_username,
    hash_password,
    mask_secrets,
    scrypt_parameters,
    verify_password,
)
from assay.master.errors import (
    AuthError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    RateLimitedError,
)
from assay.master.store import Store

FAST_N = 2**4  # scrypt's cost in tests; the default is SCRYPT_N
PASSWORD = "correct horse"


class FakeClock:
    def __init__(self) -> None:
        self.now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += dt.timedelta(**delta)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path / 'assay.db'}")
    yield s
    s.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def auth(store: Store, clock: FakeClock) -> Authenticator:
    return Authenticator(store, clock=clock, scrypt_n=FAST_N)


def _lenient(store: Store, clock: FakeClock) -> Authenticator:
    """An authenticator that never rate-limits (for tests of what a failure says)."""
    return Authenticator(
        store, clock=clock, scrypt_n=FAST_N, limiter=LoginLimiter(max_failures=1000, clock=clock)
    )


# --- passwords ----------------------------------------------------------------------------


def test_a_hash_verifies_its_password_and_no_other() -> None:
    encoded = hash_password(PASSWORD)

    assert verify_password(PASSWORD, encoded)
    assert not verify_password(PASSWORD + "!", encoded)
    assert not verify_password("", encoded)
    assert encoded.startswith(f"scrypt${SCRYPT_N}$8$1$")
    parsed = scrypt_parameters(encoded)
    assert parsed is not None
    n, r, p, salt, key = parsed
    assert (n, r, p, len(salt), len(key)) == (2**15, 8, 1, 16, 32)


def test_the_same_password_gets_a_new_salt_each_time() -> None:
    first, second = hash_password(PASSWORD, n=FAST_N), hash_password(PASSWORD, n=FAST_N)

    assert first != second
    assert first.split("$")[4] != second.split("$")[4]
    assert verify_password(PASSWORD, first)
    assert verify_password(PASSWORD, second)


def test_the_parameters_are_read_from_the_encoding() -> None:
    encoded = hash_password("päss wörd ☃", n=2**5, r=2, p=3)

    assert encoded.split("$")[1:4] == ["32", "2", "3"]
    assert verify_password("päss wörd ☃", encoded)  # checked with n=32, not the default


def _flip_last_key_char(encoded: str) -> str:
    head, key = encoded.rsplit("$", 1)
    return f"{head}${'B' if key[0] == 'A' else 'A'}{key[1:]}"


GOOD = hash_password(PASSWORD, n=FAST_N)
SALT, KEY = GOOD.split("$")[4:6]


@pytest.mark.parametrize(
    "encoded",
    [
        _flip_last_key_char(GOOD),
        GOOD.replace(f"scrypt${FAST_N}$", "scrypt$32$"),  # another cost: another key
        "",
        "scrypt",
        PASSWORD,
        f"bcrypt$16$8$1${SALT}${KEY}",
        f"scrypt$15$8$1${SALT}${KEY}",  # n is not a power of two
        f"scrypt${2**30}$8$1${SALT}${KEY}",  # asks for 128 GiB
        f"scrypt$16$0$1${SALT}${KEY}",
        f"scrypt$16$-8$1${SALT}${KEY}",
        f"scrypt$16$8$1$$${KEY}",
        f"scrypt$16$8$1${SALT}$not base64!",
        f"scrypt$16$8$1${SALT}$QUJD",  # a 3-byte key
        f"scrypt$sixteen$8$1${SALT}${KEY}",
        f"{GOOD}$extra",
    ],
    ids=[  # GOOD's salt is random: ids of their own, the same in every xdist worker
        "flipped-key",
        "other-cost",
        "empty",
        "scheme-only",
        "plain-password",
        "bcrypt",
        "n-not-a-power-of-two",
        "n-too-big",
        "r-zero",
        "r-negative",
        "no-salt",
        "key-not-base64",
        "key-too-short",
        "n-not-a-number",
        "extra-field",
    ],
)
def test_a_tampered_or_malformed_hash_verifies_false(encoded: str) -> None:
    assert not verify_password(PASSWORD, encoded)


@pytest.mark.parametrize(
    ("password", "message"),
    [
        ("short", "at least 8 characters; this one has 5"),
        ("x" * (MAX_PASSWORD + 1), "at most 1024 characters"),
        ("alice-smith", "must not be the username"),
    ],
)
def test_password_rules_say_what_to_fix(password: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        check_password(password, "alice-smith")
    check_password("x" * MAX_PASSWORD, "alice-smith")


@pytest.mark.parametrize(
    ("username", "message"),
    [
        ("", "1 to 64 characters; this one has 0"),
        ("a" * 65, "1 to 64 characters; this one has 65"),
        ("alice smith", "only contain letters, digits"),
        ("al/ice", "only contain letters, digits"),
        ("ålice", "only contain letters, digits"),
    ],
)
def test_username_rules_say_what_to_fix(username: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        check_username(username)
    check_username("A.lice_smith-2")


# --- logins and sessions ------------------------------------------------------------------


def test_a_login_gives_a_token_that_authenticates(auth: Authenticator, clock: FakeClock) -> None:
    auth.create_user("alice", PASSWORD)

    token, who, expires = auth.login("alice", PASSWORD, "10.0.0.7")

    assert token.startswith("ast_")
    assert len(token) > 40
    assert who.username == "alice"
    assert not who.admin
    assert expires == clock.now + dt.timedelta(days=7)
    assert auth.authenticate(token) == who
    assert auth.login("alice", PASSWORD, "10.0.0.7")[0] != token


def test_every_failed_login_says_the_same(store: Store, clock: FakeClock) -> None:
    auth = _lenient(store, clock)
    auth.create_user("alice", PASSWORD)
    auth.create_user("carol", PASSWORD)
    auth.deactivate("carol")
    store.ensure_user("owner")  # an experiment owner without a password
    attempts = [
        ("nobody", PASSWORD),
        ("alice", "wrong password"),
        ("alice", ""),
        ("alice", PASSWORD + "x" * MAX_PASSWORD),
        ("owner", PASSWORD),
        ("owner", ""),
        ("carol", PASSWORD),
        ("x" * 10_000, PASSWORD),
    ]
    for username, password in attempts:
        with pytest.raises(AuthError) as caught:
            auth.login(username, password, "10.0.0.7")
        assert str(caught.value) == WRONG_LOGIN


def test_an_unknown_user_costs_a_password_check(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = _lenient(store, clock)
    store.ensure_user("owner")
    checked: list[str] = []
    real = _auth.verify_password

    def spy(password: str, encoded: str) -> bool:
        checked.append(encoded)
        return real(password, encoded)

    monkeypatch.setattr(_auth, "verify_password", spy)
    for username in ("nobody", "owner"):
        with pytest.raises(AuthError):
            auth.login(username, PASSWORD, "10.0.0.7")

    assert len(checked) == 2
    assert all(scrypt_parameters(e) is not None for e in checked)


def test_an_expired_token_is_refused(store: Store, clock: FakeClock) -> None:
    auth = Authenticator(store, clock=clock, scrypt_n=FAST_N, token_ttl=dt.timedelta(hours=1))
    auth.create_user("alice", PASSWORD)
    token, _, expires = auth.login("alice", PASSWORD, "10.0.0.7")
    assert expires == clock.now + dt.timedelta(hours=1)

    clock.advance(minutes=59, seconds=58)
    auth.authenticate(token)  # now cached
    clock.advance(seconds=2)

    with pytest.raises(AuthError, match="expired at 2030-01-01 01:00 UTC; log in again"):
        auth.authenticate(token)
    assert auth.purge_expired() == 1
    with pytest.raises(AuthError, match="log in again"):
        auth.authenticate(token)


@pytest.mark.parametrize("token", ["", "ast_unknown", "Bearer x", "ast_" + "x" * 1000])
def test_unknown_tokens_are_refused(auth: Authenticator, token: str) -> None:
    with pytest.raises(AuthError, match="log in again"):
        auth.authenticate(token)


def test_logout_revokes_the_token_at_once(auth: Authenticator) -> None:
    auth.create_user("alice", PASSWORD)
    token, _, _ = auth.login("alice", PASSWORD, "10.0.0.7")
    other, _, _ = auth.login("alice", PASSWORD, "10.0.0.8")
    auth.authenticate(token)  # cached

    auth.logout(token)

    with pytest.raises(AuthError, match="not valid"):
        auth.authenticate(token)
    auth.logout(token)  # idempotent
    auth.logout("not a token")
    assert auth.authenticate(other).username == "alice"


def test_checked_tokens_are_cached_for_a_few_seconds(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = Authenticator(store, clock=clock, scrypt_n=FAST_N)
    auth.create_user("alice", PASSWORD)
    token, _, _ = auth.login("alice", PASSWORD, "10.0.0.7")
    reads: list[str] = []
    real = store.get_session

    def counted(token_hash: str) -> object:
        reads.append(token_hash)
        return real(token_hash)

    monkeypatch.setattr(store, "get_session", counted)
    for _ in range(100):
        auth.authenticate(token)
    assert len(reads) == 1
    clock.advance(seconds=5)
    auth.authenticate(token)
    assert len(reads) == 2

    # Another master's logout is seen here when the cached entry runs out.
    Authenticator(store, clock=clock, scrypt_n=FAST_N).logout(token)
    auth.authenticate(token)
    clock.advance(seconds=5)
    with pytest.raises(AuthError):
        auth.authenticate(token)


def test_the_cache_is_bounded(store: Store, clock: FakeClock) -> None:
    auth = Authenticator(store, clock=clock, scrypt_n=FAST_N, cache_size=3)
    auth.create_user("alice", PASSWORD)
    tokens = [auth.login("alice", PASSWORD, "10.0.0.7")[0] for _ in range(5)]
    for token in tokens:
        auth.authenticate(token)
    assert len(auth._cache) == 3


def test_use_is_noted_now_and_then(store: Store, clock: FakeClock) -> None:
    auth = Authenticator(store, clock=clock, scrypt_n=FAST_N, cache_ttl=dt.timedelta(0))
    user = auth.create_user("alice", PASSWORD)
    token, _, _ = auth.login("alice", PASSWORD, "10.0.0.7")
    login_time = clock.now

    clock.advance(minutes=1)
    auth.authenticate(token)
    assert store.list_sessions(user.id)[0].last_used_at is None
    clock.advance(minutes=5)
    auth.authenticate(token)

    [session] = store.list_sessions(user.id)
    assert session.last_used_at == clock.now
    assert session.created_at == login_time
    assert session.peer == "10.0.0.7"


def test_deactivation_ends_every_session_and_blocks_logins(auth: Authenticator) -> None:
    auth.create_user("alice", PASSWORD)
    tokens = [auth.login("alice", PASSWORD, "10.0.0.7")[0] for _ in range(2)]
    for token in tokens:
        auth.authenticate(token)

    auth.deactivate("alice")

    for token in tokens:
        with pytest.raises(AuthError, match="log in again"):
            auth.authenticate(token)
    with pytest.raises(AuthError, match=WRONG_LOGIN):
        auth.login("alice", PASSWORD, "10.0.0.7")
    auth.activate("alice")
    fresh, _, _ = auth.login("alice", PASSWORD, "10.0.0.7")
    assert auth.authenticate(fresh).username == "alice"
    with pytest.raises(AuthError):
        auth.authenticate(tokens[0])


def test_a_new_password_keeps_only_the_session_that_set_it(auth: Authenticator) -> None:
    auth.create_user("alice", PASSWORD)
    current, _, _ = auth.login("alice", PASSWORD, "10.0.0.7")
    other, _, _ = auth.login("alice", PASSWORD, "10.0.0.8")
    auth.authenticate(other)

    with pytest.raises(AuthError, match="current password is wrong"):
        auth.change_password("alice", "wrong password", "battery staple", current_token=current)
    with pytest.raises(InvalidArgumentError, match="at least 8"):
        auth.change_password("alice", PASSWORD, "short", current_token=current)
    auth.change_password("alice", PASSWORD, "battery staple", current_token=current)

    assert auth.authenticate(current).username == "alice"
    with pytest.raises(AuthError):
        auth.authenticate(other)
    with pytest.raises(AuthError, match=WRONG_LOGIN):
        auth.login("alice", PASSWORD, "10.0.0.7")
    auth.login("alice", "battery staple", "10.0.0.7")


def test_an_admin_reset_ends_every_session(auth: Authenticator) -> None:
    auth.create_user("alice", PASSWORD)
    token, _, _ = auth.login("alice", PASSWORD, "10.0.0.7")
    auth.authenticate(token)

    auth.set_password("alice", "battery staple")

    with pytest.raises(AuthError):
        auth.authenticate(token)
    auth.login("alice", "battery staple", "10.0.0.7")
    auth.create_user("bob-the-builder", PASSWORD)
    with pytest.raises(InvalidArgumentError, match="username"):
        auth.set_password("bob-the-builder", "bob-the-builder")
    with pytest.raises(NotFoundError):
        auth.set_password("nobody", "battery staple")


def test_the_raw_token_is_nowhere_in_the_database(store: Store, auth: Authenticator) -> None:
    auth.create_user("alice", PASSWORD)
    token, _, _ = auth.login("alice", PASSWORD, "10.0.0.7")

    with store.read() as s:
        rows = s.execute(text("SELECT * FROM sessions")).all()
    stored = " ".join(str(value) for row in rows for value in row)

    assert len(rows) == 1
    assert token not in stored
    assert token[4:] not in stored
    assert hashlib.sha256(token.encode()).hexdigest() in stored


def test_rights_change_at_once_for_cached_tokens(auth: Authenticator) -> None:
    auth.create_user("root", PASSWORD, admin=True)
    auth.create_user("alice", PASSWORD)
    token, _, _ = auth.login("alice", PASSWORD, "10.0.0.7")
    assert not auth.authenticate(token).admin

    auth.set_admin("alice", True)
    assert auth.authenticate(token).admin
    auth.set_admin("alice", False)
    assert not auth.authenticate(token).admin


def test_the_last_admin_who_can_log_in_stays(auth: Authenticator) -> None:
    auth.create_user("root", PASSWORD, admin=True)

    with pytest.raises(ConflictError, match="last active admin"):
        auth.deactivate("root")
    with pytest.raises(ConflictError, match="last active admin"):
        auth.set_admin("root", False)
    auth.create_user("alice", PASSWORD, admin=True)
    auth.deactivate("root")


def test_an_experiment_owner_can_be_given_a_login(store: Store, auth: Authenticator) -> None:
    store.ensure_user("alice")
    with pytest.raises(AuthError):
        auth.login("alice", "", "10.0.0.7")

    made = auth.create_user("alice", PASSWORD)

    assert made.has_password
    assert auth.login("alice", PASSWORD, "10.0.0.7")[1].username == "alice"
    with pytest.raises(ConflictError, match="already exists"):
        auth.create_user("alice", "another password")
    with pytest.raises(InvalidArgumentError, match="only contain"):
        auth.create_user("bad name", PASSWORD)


def test_concurrent_callers_share_the_authenticator(auth: Authenticator) -> None:
    auth.create_user("alice", PASSWORD)
    tokens = [auth.login("alice", PASSWORD, "10.0.0.7")[0] for _ in range(4)]
    errors: list[BaseException] = []

    def hammer(token: str) -> None:
        try:
            for _ in range(200):
                assert auth.authenticate(token).username == "alice"
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=hammer, args=(t,)) for t in tokens * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# --- the first admin ----------------------------------------------------------------------


def test_bootstrap_generates_a_password_once(auth: Authenticator) -> None:
    generated = auth.bootstrap_admin(None)

    assert generated is not None
    assert len(generated) >= 20
    assert auth.login("admin", generated, "10.0.0.7")[1].admin
    assert auth.bootstrap_admin(None) is None
    assert auth.bootstrap_admin("another password") is None
    auth.login("admin", generated, "10.0.0.7")


def test_bootstrap_gives_the_owner_admin_the_configured_password(
    store: Store, auth: Authenticator
) -> None:
    store.ensure_user("admin")  # made earlier as the default experiment owner

    assert auth.bootstrap_admin("configured pass") is None

    _, who, _ = auth.login("admin", "configured pass", "10.0.0.7")
    assert who.admin
    assert who.user_id == store.get_user("admin").id
    with pytest.raises(InvalidArgumentError, match="at least 8"):
        Authenticator(store, scrypt_n=FAST_N).set_password("admin", "short")


def test_bootstrap_refuses_a_weak_configured_password(auth: Authenticator) -> None:
    with pytest.raises(InvalidArgumentError, match="at least 8"):
        auth.bootstrap_admin("admin")


def test_bootstrap_leaves_an_existing_admin_alone(store: Store, auth: Authenticator) -> None:
    auth.create_user("root", PASSWORD, admin=True)

    assert auth.bootstrap_admin(None) is None

    with pytest.raises(NotFoundError):
        store.get_user("admin")


# --- the login limiter --------------------------------------------------------------------


def _fail(auth: Authenticator, username: str, peer: str, times: int = 1) -> None:
    for _ in range(times):
        with pytest.raises(AuthError):
            auth.login(username, "wrong password", peer)


def test_failures_for_a_username_from_an_address_lock_them_for_a_growing_time(
    auth: Authenticator, clock: FakeClock
) -> None:
    auth.create_user("alice", PASSWORD)
    _fail(auth, "alice", "10.0.0.9", times=5)

    delays = []
    for _ in range(7):
        with pytest.raises(RateLimitedError) as caught:
            auth.login("alice", PASSWORD, "10.0.0.9")  # even the right password
        delays.append(caught.value.retry_after_s)
        clock.advance(seconds=caught.value.retry_after_s)
        _fail(auth, "alice", "10.0.0.9")

    assert delays == [30, 60, 120, 240, 480, 900, 900]
    assert "try again in 900 seconds" in str(caught.value)
    clock.advance(seconds=900)
    auth.login("alice", PASSWORD, "10.0.0.9")


def test_guesses_from_other_addresses_do_not_lock_the_owner_out(auth: Authenticator) -> None:
    auth.create_user("alice", PASSWORD)
    auth.login("alice", PASSWORD, "10.0.1.1")  # her own machine, known from then on
    for n in range(4):
        _fail(auth, "alice", f"10.0.0.{n}", times=5)
        with pytest.raises(RateLimitedError):
            auth.login("alice", PASSWORD, f"10.0.0.{n}")
    auth.login("alice", PASSWORD, "10.0.1.1")


def test_guesses_spread_over_many_addresses_are_limited(
    auth: Authenticator, clock: FakeClock
) -> None:
    auth.create_user("alice", PASSWORD)
    auth.login("alice", PASSWORD, "10.0.1.1")
    guesses = 0
    for n in range(1000):  # a botnet: one guess from each address
        try:
            auth.login("alice", "wrong password", f"10.{n // 256}.{n % 256}.9")
        except RateLimitedError:
            continue
        except AuthError:
            guesses += 1
    assert guesses == 20  # then every address she never used is refused
    with pytest.raises(RateLimitedError):
        auth.login("alice", PASSWORD, "192.168.7.7")
    auth.login("alice", PASSWORD, "10.0.1.1")  # where she logged in before: still in
    clock.advance(minutes=20)  # the guesses stopped: a new address works again
    auth.login("alice", PASSWORD, "192.168.7.7")


def test_a_quiet_username_is_forgiven(auth: Authenticator, clock: FakeClock) -> None:
    auth.create_user("alice", PASSWORD)
    _fail(auth, "alice", "10.0.0.1", times=5)
    clock.advance(seconds=30 + 15 * 60)

    _fail(auth, "alice", "10.0.0.1", times=4)  # a fresh count, not a doubled lock
    with pytest.raises(AuthError):
        auth.login("alice", "wrong password", "10.0.0.1")
    with pytest.raises(RateLimitedError) as caught:
        auth.login("alice", PASSWORD, "10.0.0.1")
    assert caught.value.retry_after_s == 30


def test_failures_spread_over_time_do_not_lock(auth: Authenticator, clock: FakeClock) -> None:
    auth.create_user("alice", PASSWORD)
    for _ in range(10):
        _fail(auth, "alice", "10.0.0.1")
        clock.advance(minutes=2)
    auth.login("alice", PASSWORD, "10.0.0.1")


def test_five_typos_behind_a_nat_lock_out_no_colleague(auth: Authenticator) -> None:
    auth.create_user("alice", PASSWORD)
    auth.create_user("bob", PASSWORD)
    _fail(auth, "bob", "203.0.113.1", times=5)  # bob, behind the office NAT

    with pytest.raises(RateLimitedError):
        auth.login("bob", PASSWORD, "203.0.113.1")
    auth.login("alice", PASSWORD, "203.0.113.1")  # the same address: not locked


def test_failures_from_one_address_at_many_names_lock_the_address(
    store: Store, auth: Authenticator
) -> None:
    auth.create_user("alice", PASSWORD)
    for n in range(50):
        _fail(auth, f"guess{n}", "10.0.0.66")

    with pytest.raises(RateLimitedError):
        auth.login("alice", PASSWORD, "10.0.0.66")
    auth.login("alice", PASSWORD, "10.0.0.7")


def test_a_success_resets_the_username_but_not_the_address(auth: Authenticator) -> None:
    auth.create_user("alice", PASSWORD)
    auth.create_user("mallory", PASSWORD)
    auth.login("alice", PASSWORD, "10.0.0.1")
    _fail(auth, "alice", "10.0.0.1", times=4)
    auth.login("alice", PASSWORD, "10.0.0.1")
    _fail(auth, "alice", "10.0.0.1", times=4)
    auth.login("alice", PASSWORD, "10.0.0.1")  # 8 failures, never 5 in a row

    for n in range(12):
        _fail(auth, f"guess{n}", "10.0.0.66", times=4)  # 48 at other names
    auth.login("mallory", PASSWORD, "10.0.0.66")  # her own account: the address keeps count
    _fail(auth, "bob", "10.0.0.66", times=2)
    with pytest.raises(RateLimitedError):
        auth.login("mallory", PASSWORD, "10.0.0.66")


def test_a_refused_attempt_checks_no_password(
    auth: Authenticator, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth.create_user("alice", PASSWORD)
    _fail(auth, "alice", "10.0.0.1", times=5)
    checked: list[str] = []

    def spy(password: str, encoded: str) -> bool:
        checked.append(encoded)
        return True

    monkeypatch.setattr(_auth, "verify_password", spy)

    with pytest.raises(RateLimitedError):
        auth.login("alice", PASSWORD, "10.0.0.1")
    assert checked == []


def test_parallel_attempts_count_before_they_fail(clock: FakeClock) -> None:
    limiter = LoginLimiter(clock=clock)
    with ExitStack() as stack:
        for _ in range(5):
            stack.enter_context(limiter.attempt("alice", ""))
        with pytest.raises(RateLimitedError), limiter.attempt("alice", ""):
            pass
    assert limiter.keys() == (0, 0)  # undecided attempts leave nothing behind


def test_the_limiter_remembers_a_bounded_number_of_keys(clock: FakeClock) -> None:
    limiter = LoginLimiter(max_keys=100, clock=clock)
    for n in range(1000):
        with limiter.attempt(f"user{n}", f"10.0.{n // 256}.{n % 256}") as attempt:
            attempt.failed()
    assert limiter.keys() == (100, 100)
    with limiter.attempt("user999", "10.0.3.231") as attempt:
        attempt.succeeded()
    assert limiter.keys() == (99, 100)


def test_limiter_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_failures must be at least 1, got 0"):
        LoginLimiter(max_failures=0)
    with pytest.raises(ValueError, match="account_failures must be at least 1, got 0"):
        LoginLimiter(account_failures=0)
    with pytest.raises(ValueError, match="first_delay <= max_delay"):
        LoginLimiter(first_delay=dt.timedelta(hours=1))


# --- masking ------------------------------------------------------------------------------

TOKEN = "ast_" + "Ab3_-" * 8


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (f"authorization: Bearer {TOKEN}", "authorization: Bearer ***"),
        (f"token={TOKEN}&next=1", "token=***&next=1"),
        (f"['{TOKEN}', '{TOKEN}']", "['***', '***']"),
        ("password=hunter22 user=alice", "password=*** user=alice"),
        ("ASSAY_INITIAL_ADMIN_PASSWORD=s3cret!", "ASSAY_INITIAL_ADMIN_PASSWORD=***"),
        ('{"password": "hun\\"ter", "user": "a"}', '{"password": "***", "user": "a"}'),
        (
            "{'new_password': 'x y', 'old_password':'z'}",
            "{'new_password': '***', 'old_password':'***'}",
        ),
        ('password: "hunter2"', 'password: "***"'),
        (
            "last_used_at fast_path wrong username or password",
            "last_used_at fast_path wrong username or password",
        ),
    ],
)
def test_secrets_are_masked(text: str, masked: str) -> None:
    assert mask_secrets(text) == masked
