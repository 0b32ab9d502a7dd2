"""Users and their login sessions.

A user is made by an admin (with a password) or as an experiment's owner (without one:
such a user cannot log in). A session is one login, kept as the SHA-256 of its bearer
token; deactivating a user or changing its password ends its sessions in the same
transaction. Users are never deleted, so their ids are cached.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Engine, delete, exists, inspect, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.master.errors import ConflictError, NotFoundError
from assay.master.store._base import StoreBase, now
from assay.master.store._models import DEFAULT_WORKSPACE_ID, LoginSession, User, WorkspaceMember
from assay.master.store._records import Credentials, SessionRecord, UserRecord


class UserQueries(StoreBase):
    """Users and sessions."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._user_ids: dict[str, int] = {}  # users are never deleted: ids are stable
        self._has_workspaces: bool | None = None

    # --- users ----------------------------------------------------------------------------

    def create_user(
        self, username: str, *, password_hash: str | None = None, admin: bool = False
    ) -> UserRecord:
        """Create a user; creating an existing one is refused. A new user is an editor of
        the Default workspace (an admin of it may remove them)."""
        try:
            with self.write() as s:
                user = User(username=username, password_hash=password_hash, admin=admin)
                s.add(user)
                s.flush()
                if self._workspaces_exist():
                    s.add(
                        WorkspaceMember(
                            workspace_id=DEFAULT_WORKSPACE_ID, user_id=user.id, role="editor"
                        )
                    )
                    s.flush()
                return _user(user)
        except IntegrityError:
            raise ConflictError(f"user {username!r} already exists") from None
        finally:
            self._members_changed()

    def _workspaces_exist(self) -> bool:
        """Whether the schema has workspaces (0009): a store opened without migrating, on
        a database of an older release, has none to add a new user to."""
        if self._has_workspaces is None:
            tables = inspect(self.engine).get_table_names()
            self._has_workspaces = "workspace_members" in tables
        return self._has_workspaces

    def get_user(self, username: str) -> UserRecord:
        with self.read() as s:
            user = s.execute(select(User).where(User.username == username)).scalar()
            if user is None:
                raise NotFoundError(f"user {username!r} does not exist")
            return _user(user)

    def ensure_user(self, username: str) -> UserRecord:
        """The user named `username`, created if missing (idempotent)."""
        try:
            return self.get_user(username)
        except NotFoundError:
            try:
                return self.create_user(username)
            except ConflictError:
                return self.get_user(username)

    def user_id(self, username: str) -> int:
        """The id of `username`, created if missing (cached: users are never deleted)."""
        found = self._user_ids.get(username)
        if found is None:
            found = self._user_ids[username] = self.ensure_user(username).id
        return found

    def get_credentials(self, username: str) -> Credentials:
        """The user with its password hash, to check a login."""
        with self.read() as s:
            user = s.execute(select(User).where(User.username == username)).scalar()
            if user is None:
                raise NotFoundError(f"user {username!r} does not exist")
            return Credentials(_user(user), user.password_hash)

    def list_users(self) -> list[UserRecord]:
        with self.read() as s:
            return [_user(u) for u in s.execute(select(User).order_by(User.username)).scalars()]

    def set_password_hash(
        self, username: str, password_hash: str | None, *, keep_session: str | None = None
    ) -> UserRecord:
        """Replace the user's password hash and end its sessions, in one transaction.

        The session whose token hash is `keep_session` survives (the one that changed
        the password). Idempotent.
        """
        with self.write() as s:
            user = _locked_user(s, username)
            user.password_hash = password_hash
            _end_sessions(s, user.id, keep_session)
            return _user(user)

    def set_user_active(self, username: str, active: bool) -> UserRecord:
        """(De)activate a user; deactivating ends its sessions in the same transaction.

        Idempotent.
        """
        with self.write() as s:
            user = _locked_user(s, username)
            user.active = active
            if not active:
                _end_sessions(s, user.id, None)
            return _user(user)

    def set_user_admin(self, username: str, admin: bool) -> UserRecord:
        """Grant or withdraw admin rights (idempotent)."""
        with self.write() as s:
            user = _locked_user(s, username)
            user.admin = admin
            return _user(user)

    def claim_admin(self, username: str, password_hash: str) -> bool:
        """Make `username` an active admin with this password, unless an active admin
        with a password exists already; return whether it did.

        Masters starting together on one database claim once: the check and the
        write share a transaction that holds the user's row.
        """
        self.ensure_user(username)
        with self.write() as s:
            user = _locked_user(s, username)
            usable = exists().where(
                User.admin.is_(True), User.active.is_(True), User.password_hash.is_not(None)
            )
            if s.execute(select(usable)).scalar():
                return False
            user.password_hash, user.admin, user.active = password_hash, True, True
            _end_sessions(s, user.id, None)
            return True

    def create_session(
        self,
        user_id: int,
        token_hash: str,
        expires_at: dt.datetime,
        *,
        peer: str = "",
        created_at: dt.datetime | None = None,
    ) -> SessionRecord:
        """Record a login of an active user (not idempotent: each call is a session)."""
        with self.write() as s:
            user = s.get(User, user_id, with_for_update=True)
            if user is None:
                raise NotFoundError(f"user {user_id} does not exist")
            if not user.active:
                raise ConflictError(f"user {user.username!r} is deactivated")
            row = LoginSession(
                user_id=user_id,
                token_hash=token_hash,
                peer=peer[:255],
                created_at=_utc(created_at or now()),
                expires_at=_utc(expires_at),
            )
            s.add(row)
            s.flush()
            return _session(row, user)

    def get_session(self, token_hash: str) -> SessionRecord:
        """The session with this token hash, and its user's current state."""
        with self.read() as s:
            found = s.execute(
                select(LoginSession, User)
                .join(User, User.id == LoginSession.user_id)
                .where(LoginSession.token_hash == token_hash)
            ).first()
            if found is None:
                raise NotFoundError("no such session")
            return _session(found[0], found[1])

    def list_sessions(self, user_id: int) -> list[SessionRecord]:
        """The user's sessions, oldest first (expired ones too, until purged)."""
        with self.read() as s:
            rows = s.execute(
                select(LoginSession, User)
                .join(User, User.id == LoginSession.user_id)
                .where(LoginSession.user_id == user_id)
                .order_by(LoginSession.id)
            ).all()
            return [_session(row, user) for row, user in rows]

    def touch_session(self, token_hash: str, used_at: dt.datetime) -> None:
        """Note when the session was last used (idempotent; a gone session is ignored)."""
        with self.write() as s:
            row = s.execute(
                select(LoginSession).where(LoginSession.token_hash == token_hash)
            ).scalar()
            if row is not None:
                row.last_used_at = _utc(used_at)

    def delete_session(self, token_hash: str) -> bool:
        """End one session; return whether it existed (idempotent)."""
        with self.write() as s:
            query = delete(LoginSession).where(LoginSession.token_hash == token_hash)
            return bool(s.execute(query).rowcount)  # type: ignore[attr-defined]

    def purge_expired_sessions(self, now: dt.datetime) -> int:
        """Delete sessions that expired before `now`; return how many (idempotent)."""
        with self.write() as s:
            query = delete(LoginSession).where(LoginSession.expires_at <= _utc(now))
            return int(s.execute(query).rowcount)  # type: ignore[attr-defined]


def _user(u: User) -> UserRecord:
    return UserRecord(
        id=u.id,
        username=u.username,
        admin=u.admin,
        active=u.active,
        has_password=u.password_hash is not None,
    )


def _locked_user(s: Session, username: str) -> User:
    user = s.execute(select(User).where(User.username == username).with_for_update()).scalar()
    if user is None:
        raise NotFoundError(f"user {username!r} does not exist")
    return user


def _end_sessions(s: Session, user_id: int, keep: str | None) -> int:
    query = delete(LoginSession).where(LoginSession.user_id == user_id)
    if keep is not None:
        query = query.where(LoginSession.token_hash != keep)
    return int(s.execute(query).rowcount)  # type: ignore[attr-defined]


def _utc(when: dt.datetime) -> dt.datetime:
    # SQLite keeps no offset: every time is stored in UTC and read back as UTC.
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


def _session(row: LoginSession, user: User) -> SessionRecord:
    return SessionRecord(
        id=row.id,
        user_id=user.id,
        username=user.username,
        admin=user.admin,
        active=user.active,
        peer=row.peer,
        created_at=_utc(row.created_at),
        expires_at=_utc(row.expires_at),
        last_used_at=None if row.last_used_at is None else _utc(row.last_used_at),
    )


__all__ = ["UserQueries"]
