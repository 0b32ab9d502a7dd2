"""Users and logins: password hashes, session tokens, and the limit on failed logins.

A master on a shared network is closed by default: every call but the login carries a
session token (`ast_...`), which the database keeps only as its SHA-256. Passwords are
kept as scrypt hashes that carry their own parameters, so the cost can rise later while
the hashes stored before it still verify.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

from assay.master.auth._login_limits import LoginAttempt, LoginLimiter
from assay.master.auth._secrets import mask_text
from assay.master.errors import (
    AuthError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    RateLimitedError,
)
from assay.master.store import Store, UserRecord

Clock = Callable[[], dt.datetime]

# scrypt's cost: 2**15 * 8 * 128 bytes = 32 MiB of memory and about 0.1 s per hash.
SCRYPT_N = 2**15
SCRYPT_R = 8
SCRYPT_P = 1
_SALT_BYTES = 16
_KEY_BYTES = 32
# Bounds on the parameters read back from a stored hash: a damaged row must not make a
# login allocate gigabytes.
_MAX_N, _MAX_R, _MAX_P = 2**20, 32, 16

MIN_PASSWORD = 8
MAX_PASSWORD = 1024  # checked before hashing: scrypt of a huge input is a cheap DoS
TOKEN_PREFIX = "ast_"
_MAX_TOKEN = 256
_MAX_USERNAME = 128  # the users.username column
_USERNAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ADMIN = "admin"
WRONG_LOGIN = "wrong username or password"
_NO_SESSION = "the session token is not valid (logged out, revoked or never issued); log in again"


@dataclass(frozen=True)
class Principal:
    """Who a call is made by."""

    user_id: int
    username: str
    admin: bool


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --- passwords ----------------------------------------------------------------------------


def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """The password's salted scrypt hash, encoded as `scrypt$n$r$p$salt$key` (base64)."""
    salt = secrets.token_bytes(_SALT_BYTES)
    key = _scrypt(password, salt, n, r, p, _KEY_BYTES)
    b64 = [base64.b64encode(b).decode("ascii") for b in (salt, key)]
    return "$".join(["scrypt", str(n), str(r), str(p), *b64])


def verify_password(password: str, encoded: str) -> bool:
    """Whether `password` matches `encoded`; a malformed encoding is False, never an error."""
    parsed = scrypt_parameters(encoded)
    if parsed is None:
        return False
    n, r, p, salt, key = parsed
    try:
        candidate = _scrypt(password, salt, n, r, p, len(key))
    except (ValueError, MemoryError):
        return False
    return hmac.compare_digest(candidate, key)


def scrypt_parameters(encoded: str) -> tuple[int, int, int, bytes, bytes] | None:
    """(n, r, p, salt, key) of an encoded hash, or None when it is not one we can check."""
    parts = encoded.split("$") if isinstance(encoded, str) else []
    if len(parts) != 6 or parts[0] != "scrypt":
        return None
    try:
        n, r, p = (int(x) for x in parts[1:4])
        salt, key = (base64.b64decode(x, validate=True) for x in parts[4:6])
    except (ValueError, binascii.Error):
        return None
    if not (1 < n <= _MAX_N and n & (n - 1) == 0 and 0 < r <= _MAX_R and 0 < p <= _MAX_P):
        return None
    if not salt or not 16 <= len(key) <= 64:
        return None
    return n, r, p, salt, key


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8", "surrogatepass"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        maxmem=128 * r * (n + p + 2) + (1 << 20),
        dklen=length,
    )


def check_username(username: str) -> None:
    """Refuse a user name that is not 1-64 letters, digits, '_', '.' or '-'."""
    if not 1 <= len(username) <= 64:
        raise InvalidArgumentError(
            f"a username has 1 to 64 characters; this one has {len(username)}"
        )
    if not _USERNAME.fullmatch(username):
        raise InvalidArgumentError(
            f"username {username!r} may only contain letters, digits, '_', '.' and '-'"
        )


def check_password(password: str, username: str) -> None:
    """Refuse a password that is too short, too long, or the user's own name."""
    if len(password) < MIN_PASSWORD:
        raise InvalidArgumentError(
            f"a password needs at least {MIN_PASSWORD} characters; this one has {len(password)}"
        )
    if len(password) > MAX_PASSWORD:
        raise InvalidArgumentError(f"a password may have at most {MAX_PASSWORD} characters")
    if password == username:
        raise InvalidArgumentError("the password must not be the username; choose another")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


# --- masking ------------------------------------------------------------------------------

_TOKEN = re.compile(r"\b" + TOKEN_PREFIX + r"[A-Za-z0-9_-]+")


def mask_secrets(text: str) -> str:
    """`text` with session tokens, and the values of passwords, keys and other secrets
    (`password=...`, `"secret_key": "..."`, YAML's `access_key: ...`), replaced by `***`.

    For what goes into logs: which names are secret is `_secrets.is_secret_name`.
    """
    if TOKEN_PREFIX in text:
        text = _TOKEN.sub("***", text)
    return mask_text(text, "***")


# --- the authenticator --------------------------------------------------------------------


@dataclass(frozen=True)
class _Cached:
    principal: Principal
    expires_at: dt.datetime
    cached_at: dt.datetime


class Authenticator:
    """Logs users in and checks session tokens; safe to call from any thread.

    Checked tokens are remembered for `cache_ttl` (at most `cache_size` of them), so a
    hot RPC path does not read the database on every call. Logging out, changing a
    password, deactivating a user and changing its rights forget them at once in this
    process; another master on the same database notices within `cache_ttl`.
    `scrypt_n` sets the cost of new password hashes (lower it only in tests).
    `login_failures_per_minute`: failed logins a minute, cluster-wide, past which logins
    from addresses their user name never logged in from are paced (0: never; see
    `LoginLimiter`).
    """

    def __init__(
        self,
        store: Store,
        *,
        token_ttl: dt.timedelta = dt.timedelta(days=7),
        clock: Clock = _utcnow,
        limiter: LoginLimiter | None = None,
        cache_ttl: dt.timedelta = dt.timedelta(seconds=5),
        cache_size: int = 10_000,
        touch_interval: dt.timedelta = dt.timedelta(minutes=5),
        scrypt_n: int = SCRYPT_N,
        login_failures_per_minute: int = 0,
    ) -> None:
        if token_ttl <= dt.timedelta(0):
            raise ValueError(f"token_ttl must be positive, got {token_ttl}")
        self._store = store
        self._token_ttl = token_ttl
        self._clock = clock
        self._limiter = limiter or LoginLimiter(
            clock=clock,
            global_failures=login_failures_per_minute,
            known_peer=self._logged_in_from,
        )
        self._cache_ttl = cache_ttl
        self._cache_size = cache_size
        self._touch_interval = touch_interval
        self._scrypt_n = scrypt_n
        # Checked when a user is unknown, so that a miss costs what a wrong password does.
        self._dummy_hash = self._hash(secrets.token_urlsafe(16))
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._generation = 0  # bumped by every invalidation

    @property
    def limiter(self) -> LoginLimiter:
        return self._limiter

    def login(self, username: str, password: str, peer: str) -> tuple[str, Principal, dt.datetime]:
        """Check the password and open a session: (token, who, when the token expires).

        Every failure (unknown user, wrong password, no password, deactivated) raises
        the same `AuthError` after the same work; too many raise `RateLimitedError`.
        """
        with self._limiter.attempt(username, peer) as attempt:
            user = self._check_password(username, password)
            if user is None:
                attempt.failed()
                raise AuthError(WRONG_LOGIN)
            attempt.succeeded()
        now = self._clock()
        expires = now + self._token_ttl
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        try:
            self._store.create_session(user.id, _digest(token), expires, peer=peer, created_at=now)
        except (ConflictError, NotFoundError):  # deactivated meanwhile
            raise AuthError(WRONG_LOGIN) from None
        return token, Principal(user.id, user.username, user.admin), expires

    def cached(self, token: str) -> Principal | None:
        """Who holds `token` if this process has checked it within the cache's time; None
        when only the database can tell (no I/O here: safe on an event loop)."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > _MAX_TOKEN:
            return None
        key = _digest(token)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            fresh = hit is not None and dt.timedelta(0) <= now - hit.cached_at < self._cache_ttl
            if hit is None or not fresh or hit.expires_at <= now:
                return None
            self._cache.move_to_end(key)
            return hit.principal

    def authenticate(self, token: str) -> Principal:
        """Who holds `token`; `AuthError` for a token that is unknown, expired or revoked."""
        if not token:
            raise AuthError("this call needs a session token; log in again")
        if len(token) > _MAX_TOKEN or not token.startswith(TOKEN_PREFIX):
            raise AuthError(_NO_SESSION)
        key = _digest(token)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and dt.timedelta(0) <= now - hit.cached_at < self._cache_ttl:
                self._cache.move_to_end(key)
                _check_expiry(hit.expires_at, now)
                return hit.principal
            generation = self._generation
        try:
            session = self._store.get_session(key)
        except NotFoundError:
            raise AuthError(_NO_SESSION) from None
        _check_expiry(session.expires_at, now)
        if not session.active:
            raise AuthError(_NO_SESSION)
        if now - (session.last_used_at or session.created_at) >= self._touch_interval:
            self._store.touch_session(key, now)
        principal = Principal(session.user_id, session.username, session.admin)
        with self._lock:
            # A revocation while the database was read must not be undone by caching.
            if generation == self._generation:
                self._cache[key] = _Cached(principal, session.expires_at, now)
                self._cache.move_to_end(key)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return principal

    def logout(self, token: str) -> None:
        """End the token's session (idempotent)."""
        if token.startswith(TOKEN_PREFIX) and len(token) <= _MAX_TOKEN:
            key = _digest(token)
            self._store.delete_session(key)
            with self._lock:
                self._cache.pop(key, None)
                self._generation += 1

    def create_user(self, username: str, password: str, *, admin: bool = False) -> UserRecord:
        """Create a user who can log in.

        A user that exists only as an experiment owner (no password yet) is given the
        password; any other existing user is refused with `ConflictError`.
        """
        check_username(username)
        check_password(password, username)
        password_hash = self._hash(password)
        try:
            return self._store.create_user(username, password_hash=password_hash, admin=admin)
        except ConflictError:
            existing = self._store.get_user(username)
            if existing.has_password or not existing.active:
                raise
        self._store.set_password_hash(username, password_hash)
        user = self._store.set_user_admin(username, admin)
        self._forget_user(user.id)
        return user

    def change_password(
        self,
        username: str,
        old: str,
        new: str,
        *,
        current_token: str | None = None,
        peer: str = "",
    ) -> None:
        """Change one's own password; ends the user's sessions but `current_token`'s."""
        check_password(new, username)
        with self._limiter.attempt(username, peer) as attempt:
            user = self._check_password(username, old)
            if user is None:
                attempt.failed()
                raise AuthError("the current password is wrong")
            attempt.succeeded()
        keep = _digest(current_token) if current_token else None
        self._store.set_password_hash(username, self._hash(new), keep_session=keep)
        self._forget_user(user.id)

    def set_password(self, username: str, new: str) -> None:
        """Set a user's password (an admin's reset); ends all of the user's sessions."""
        check_password(new, username)
        user = self._store.set_password_hash(username, self._hash(new))
        self._forget_user(user.id)

    def deactivate(self, username: str) -> None:
        """Block the user's logins and end its sessions (idempotent)."""
        self._keep_an_admin(username)
        user = self._store.set_user_active(username, False)
        self._forget_user(user.id)

    def activate(self, username: str) -> None:
        """Let a deactivated user log in again (idempotent)."""
        self._store.set_user_active(username, True)

    def set_admin(self, username: str, admin: bool) -> None:
        """Grant or withdraw admin rights; the user's tokens carry the change at once."""
        if not admin:
            self._keep_an_admin(username)
        user = self._store.set_user_admin(username, admin)
        self._forget_user(user.id)

    def bootstrap_admin(self, password: str | None) -> str | None:
        """Make sure an active admin with a password exists.

        When none does, user `admin` (created if missing) becomes one, with `password`
        or, when that is None, a generated one, which is returned to be shown once.
        When one does, nothing changes (no password is ever reset) and None is returned.
        """
        if any(_can_administer(u) for u in self._store.list_users()):
            return None
        generated = None
        if password is None:
            password = generated = secrets.token_urlsafe(18)
        check_password(password, ADMIN)
        if not self._store.claim_admin(ADMIN, self._hash(password)):
            return None  # another master claimed it first
        self._forget_user(self._store.get_user(ADMIN).id)
        return generated

    def purge_expired(self) -> int:
        """Delete expired sessions from the database; return how many."""
        return self._store.purge_expired_sessions(self._clock())

    def _logged_in_from(self, username: str, peer: str) -> bool:
        """Whether a session of the user, still in the store, was opened from `peer`."""
        if len(username) > _MAX_USERNAME:
            return False
        try:
            user = self._store.get_user(username)
        except NotFoundError:
            return False
        return any(session.peer == peer for session in self._store.list_sessions(user.id))

    def _check_password(self, username: str, password: str) -> UserRecord | None:
        """The user, if it is active and `password` is its password; the same work if not."""
        credentials = None
        if len(username) <= _MAX_USERNAME:
            with suppress(NotFoundError):
                credentials = self._store.get_credentials(username)
        stored = credentials.password_hash if credentials else None
        ok = len(password) <= MAX_PASSWORD and verify_password(password, stored or self._dummy_hash)
        if ok and stored and credentials and credentials.user.active:
            return credentials.user
        return None

    def _hash(self, password: str) -> str:
        return hash_password(password, n=self._scrypt_n)

    def _keep_an_admin(self, username: str) -> None:
        admins = [u.username for u in self._store.list_users() if _can_administer(u)]
        if admins == [username]:
            raise ConflictError(
                f"{username!r} is the last active admin who can log in; "
                "make another user an admin first"
            )

    def _forget_user(self, user_id: int) -> None:
        with self._lock:
            for key in [k for k, v in self._cache.items() if v.principal.user_id == user_id]:
                del self._cache[key]
            self._generation += 1


def _check_expiry(expires_at: dt.datetime, now: dt.datetime) -> None:
    if now >= expires_at:
        raise AuthError(f"the session expired at {expires_at:%Y-%m-%d %H:%M} UTC; log in again")


def _can_administer(user: UserRecord) -> bool:
    return user.admin and user.active and user.has_password


__all__ = [
    "ADMIN",
    "MAX_PASSWORD",
    "MIN_PASSWORD",
    "SCRYPT_N",
    "TOKEN_PREFIX",
    "WRONG_LOGIN",
    "AuthError",
    "Authenticator",
    "LoginAttempt",
    "LoginLimiter",
    "Principal",
    "RateLimitedError",
    "check_password",
    "check_username",
    "hash_password",
    "mask_secrets",
    "scrypt_parameters",
    "verify_password",
]
