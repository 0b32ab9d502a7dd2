"""API handlers for users and sign-in: login, passwords, activation, usage."""

from __future__ import annotations

import grpc

from assay.master.api._servicers._base import ServicerBase
from assay.master.api._status import maps_errors
from assay.master.auth import bearer, metadata_dict
from assay.master.store import UserRecord
from assay.master.telemetry import usage
from assay.proto import api_pb2


class UserRpcs(ServicerBase):
    """Users, sign-in and slot usage (who may do what: `_auth`)."""

    @maps_errors
    def Login(  # noqa: N802
        self, request: api_pb2.LoginRequest, context: grpc.ServicerContext
    ) -> api_pb2.LoginResponse:
        token, who, expires = self.auth.login(
            request.username, request.password, _address(context.peer())
        )
        response = api_pb2.LoginResponse(token=token, user=self._user(who.username))
        response.expires_at.FromDatetime(expires)
        return response

    @maps_errors
    def Logout(  # noqa: N802
        self, request: api_pb2.LogoutRequest, context: grpc.ServicerContext
    ) -> api_pb2.LogoutResponse:
        self.auth.logout(bearer(metadata_dict(context.invocation_metadata())))
        return api_pb2.LogoutResponse()

    @maps_errors
    def WhoAmI(  # noqa: N802
        self, request: api_pb2.WhoAmIRequest, context: grpc.ServicerContext
    ) -> api_pb2.User:
        return self._user(self._who(context).username)

    @maps_errors
    def ListUsers(  # noqa: N802
        self, request: api_pb2.ListUsersRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListUsersResponse:
        return api_pb2.ListUsersResponse(users=[_user_message(u) for u in self.store.list_users()])

    @maps_errors
    def CreateUser(  # noqa: N802
        self, request: api_pb2.CreateUserRequest, context: grpc.ServicerContext
    ) -> api_pb2.User:
        self._admin(context, "create users")
        created = self.auth.create_user(request.username, request.password, admin=request.admin)
        return _user_message(created)

    @maps_errors
    def ChangePassword(  # noqa: N802
        self, request: api_pb2.ChangePasswordRequest, context: grpc.ServicerContext
    ) -> api_pb2.User:
        who = self._who(context)
        target = request.username or who.username
        if target == who.username:
            token = bearer(metadata_dict(context.invocation_metadata()))
            self.auth.change_password(
                target,
                request.old_password,
                request.new_password,
                current_token=token,
                peer=_address(context.peer()),
            )
        else:
            self._admin(context, "change another user's password")
            self.auth.set_password(target, request.new_password)
        return self._user(target)

    @maps_errors
    def SetUserActive(  # noqa: N802
        self, request: api_pb2.SetUserActiveRequest, context: grpc.ServicerContext
    ) -> api_pb2.User:
        self._admin(context, "activate or deactivate users")
        if request.active:
            self.auth.activate(request.username)
        else:
            self.auth.deactivate(request.username)
        return self._user(request.username)

    @maps_errors
    def GetUsage(  # noqa: N802
        self, request: api_pb2.GetUsageRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetUsageResponse:
        who = self._who(context)
        found = usage.report(
            self.store,
            user_id=None if who.admin else who.user_id,  # a user sees their own usage only
            by=request.by,
            since=request.since,
            until=request.until,
            per_day=request.per_day,
            capacity=usage.capacity(self.master) if who.admin else {},
        )
        return _usage_message(found)

    def _user(self, username: str) -> api_pb2.User:
        return _user_message(self.store.get_user(username))


def _user_message(user: UserRecord) -> api_pb2.User:
    return api_pb2.User(
        username=user.username,
        admin=user.admin,
        active=user.active,
        has_password=user.has_password,
    )


def _usage_message(found: usage.UsageReport) -> api_pb2.GetUsageResponse:
    response = api_pb2.GetUsageResponse(by=found.by, all_users=found.all_users)
    response.since.FromDatetime(found.since)
    response.until.FromDatetime(found.until)
    response.groups.extend(
        api_pb2.UsageGroup(
            key=g.key,
            name=g.name,
            day=g.day,
            slot_seconds=g.slot_seconds,
            slot_hours=g.slot_hours,
        )
        for g in found.groups
    )
    response.pools.extend(
        api_pb2.PoolUsage(
            pool=p.pool,
            used_slot_seconds=p.used_slot_seconds,
            capacity_slot_seconds=p.capacity_slot_seconds,
            used_ratio=p.used_ratio,
            idle_ratio=p.idle_ratio,
        )
        for p in found.pools
    )
    return response


def _address(peer: str) -> str:
    """The host of a gRPC peer (`ipv4:10.0.0.5:51234` -> `10.0.0.5`): what failed logins
    are counted by."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return peer
