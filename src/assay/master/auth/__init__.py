"""Who is calling and what they may do: users' passwords and session tokens, the limit
on failed logins, the guard in front of every RPC (default deny), workspace roles, and
which config values are secret and how they are hidden.
"""

from assay.master.auth._auth import (
    MAX_PASSWORD,
    SCRYPT_N,
    WRONG_LOGIN,
    Authenticator,
    Principal,
    check_password,
    check_username,
    hash_password,
    mask_secrets,
    scrypt_parameters,
    verify_password,
)
from assay.master.auth._guard import (
    AUTH_HEADER,
    PUBLIC_RPC_NAMES,
    AgentPass,
    Guard,
    GuardInterceptor,
    agent_pass,
    bearer,
    caller,
    calling_as,
    metadata_dict,
)
from assay.master.auth._login_limits import LoginAttempt, LoginLimiter
from assay.master.auth._roles import ADMIN, EDITOR, VIEWER, Roles
from assay.master.auth._secrets import MASK, is_secret_name, mask_text, masked, masked_config_text

__all__ = [
    "ADMIN",
    "AUTH_HEADER",
    "AgentPass",
    "Authenticator",
    "EDITOR",
    "Guard",
    "GuardInterceptor",
    "LoginAttempt",
    "LoginLimiter",
    "MASK",
    "MAX_PASSWORD",
    "PUBLIC_RPC_NAMES",
    "Principal",
    "Roles",
    "SCRYPT_N",
    "VIEWER",
    "WRONG_LOGIN",
    "agent_pass",
    "bearer",
    "caller",
    "calling_as",
    "check_password",
    "check_username",
    "hash_password",
    "is_secret_name",
    "mask_secrets",
    "mask_text",
    "masked",
    "masked_config_text",
    "metadata_dict",
    "scrypt_parameters",
    "verify_password",
]
