"""The agents' connections: who is connected with which slots, and their outboxes.

`Fleet` keeps the agents' handles and the scheduler's view of their slots in step, and
sends messages once the changes recorded so far are committed. It is used under the
master's lock and never calls the master: what an agent's arrival or loss means for
runs is decided in `lifecycle/agent.py` and applied by the `Interpreter`.

It also keeps which agent holds which name: each agent is given a credential of its own
at its first join (in exchange for the cluster's join token), and a name whose
credential was issued accepts no other until `forget` (`assay agent remove`). Only the
credentials' sha256 are kept, in memory (loaded at start) and in the agents' rows.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping

from assay.master.errors import (
    AuthError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from assay.master.fleet._agents import AgentHandle, Load, Outbox, Registration
from assay.master.lifecycle import AgentMessage, KillRun, Run
from assay.master.lifecycle.agent import AgentClock
from assay.master.scheduler import Agent, Pools, SlotType
from assay.master.store import WriteBatch

log = logging.getLogger("assay.master")


def credential_digest(credential: str) -> str:
    """What the master keeps of an agent's credential: its sha256, in hex. The
    credential is 256 random bits, so a plain hash is as hard to reverse as to guess."""
    return hashlib.sha256(credential.encode()).hexdigest()


def new_credential() -> str:
    return secrets.token_urlsafe(32)


class Fleet:
    def __init__(
        self,
        scheduler: Pools,
        batch: Callable[[], WriteBatch],
        after_commit: Callable[[Callable[[], None]], None],
        kill_grace_s: float,
    ) -> None:
        self.scheduler = scheduler
        self._batch = batch
        self._after_commit = after_commit
        self._kill_grace_s = int(kill_grace_s)
        self.agents: dict[str, AgentHandle] = {}
        self._connected_types: dict[tuple[str, str], int] = {}  # (pool, slot type) -> agents
        self._credentials: dict[str, str] = {}  # agent id -> sha256 of its credential

    def load_credentials(self, digests: Mapping[str, str]) -> None:
        """The credentials' hashes as stored (at the master's start)."""
        self._credentials.update(digests)

    def holds_credential(self, agent_id: str) -> bool:
        return agent_id in self._credentials

    def check_credential(self, agent_id: str, credential: str, *, joined: bool) -> bool:
        """May this caller register as `agent_id`? True when it must be given a
        credential (a name without one, and a caller with the join token); raises
        `PermissionDeniedError` for a name held by another credential, even for a caller
        with the join token, and `AuthError` for a credential alone on a free name."""
        held = self._credentials.get(agent_id)
        if held is not None:
            if credential and hmac.compare_digest(held, credential_digest(credential)):
                return False
            raise PermissionDeniedError(
                f"the agent name {agent_id!r} is held by another agent's credential: "
                f"this agent does not present it (its credential_file). If this is that "
                f"agent, put its credential file back; to give the name to a new agent, an "
                f"admin runs `assay agent remove {agent_id}`, which frees it"
            )
        if not joined:
            raise AuthError(
                f"the agent name {agent_id!r} has no credential here (it was removed, or "
                "this master's store is new): join with the cluster's join token to get one"
            )
        return True

    def slot_type(self, pool: str = "") -> SlotType:
        """cuda when every connected agent of the pool ("" the default) offers GPUs, else cpu."""
        pool = self.scheduler.resolve(pool)
        cuda = self._connected_types.get((pool, "cuda"), 0)
        everyone = sum(n for (p, _), n in self._connected_types.items() if p == pool)
        return "cuda" if cuda and cuda == everyone else "cpu"

    def pool_of(self, agent_id: str) -> str | None:
        """The resource pool an agent (connected or awaited) belongs to; None if unknown."""
        handle = self.agents.get(agent_id)
        return handle.pool if handle is not None else self.scheduler.pool_of(agent_id)

    def _count(self, handle: AgentHandle, delta: int) -> None:
        key = (handle.pool, handle.slot_type)
        self._connected_types[key] = self._connected_types.get(key, 0) + delta

    def register(
        self,
        register: Registration,
        peer_host: str,
        outbox: Outbox,
        now: dt.datetime,
        *,
        credential: str | None = None,
        joined: bool = False,
    ) -> tuple[AgentHandle, list[str]]:
        """A (re)connecting agent's handle, and the requests that lost their slots on
        it (an agent back with other slots is a new agent). `credential` is the one the
        agent presented ("" none) and `joined` whether it presented the join token (see
        `check_credential`); a credential issued now is in the handle's `credential`.
        None: an agent of this process (the simulation), neither checked nor given one."""
        issue = credential is not None and self.check_credential(
            register.agent_id, credential, joined=joined
        )
        slot_type, slots = register.slot_type, len(register.devices)
        if slots < 1:
            raise InvalidArgumentError(f"agent {register.agent_id!r} offers no slots")
        pool = self.scheduler.resolve(register.resource_pool)
        if self.scheduler.unknown(pool):
            raise InvalidArgumentError(
                f"agent {register.agent_id!r} names resource pool {pool!r}, which this master "
                f"does not declare: set the agent's resource_pool to one of "
                f"{', '.join(self.scheduler.names)}"
            )
        old = self.agents.get(register.agent_id)
        if old is not None and old.connected:
            raise ConflictError(f"an agent named {register.agent_id!r} is already connected")
        handle = AgentHandle(
            id=register.agent_id,
            slot_type=slot_type,
            slots=slots,
            address=register.address or peer_host,
            devices=register.devices,
            memory_bytes=register.memory_bytes,
            outbox=outbox,
            pool=pool,
            label=register.agent_label,
        )
        lost: list[str] = []
        same = (slots, slot_type, pool, register.agent_label)
        if old is not None and (old.slots, old.slot_type, old.pool, old.label) == same:
            # Back within the window: it keeps its slots and its running trials.
            handle.enabled, handle.draining = old.enabled, old.draining
            self.scheduler.set_agent_enabled(handle.id, handle.enabled)
        else:
            if old is not None:
                lost = self.drop(old.id)
            islands = tuple(d.island for d in register.devices) if slot_type == "cuda" else ()
            agent = Agent(handle.id, slots, slot_type, label=handle.label, islands=islands)
            self.scheduler.add_agent(agent, pool)
        self.agents[handle.id] = handle
        self._count(handle, +1)
        digest = None
        if issue:
            handle.credential = new_credential()
            digest = self._credentials[handle.id] = credential_digest(handle.credential)
            log.info("agent %s joined with the join token: issued its credential", handle.id)
        self._batch().agent_registered(
            handle.id,
            slot_type=slot_type,
            slots=slots,
            devices=[{"name": d.name, "uuid": d.uuid} for d in register.devices],
            address=handle.address,
            now=now,
            credential_sha256=digest,
        )
        log.info(
            "agent %s connected with %d %s slots in pool %s", handle.id, slots, slot_type, pool
        )
        return handle, lost

    def heard_from(self, agent_id: str, load: Load | None = None) -> None:
        handle = self.agents.get(agent_id)
        if handle is None:
            return
        handle.last_heartbeat = time.time()  # any message shows it is alive
        if load is not None:
            handle.cpu_utilization = load.cpu_utilization
            handle.memory_used_fraction = load.memory_used_fraction
            if load.devices:
                handle.devices = load.devices
            if load.stopping and not handle.stopping:
                # Its trials are stopping at a checkpoint to be requeued: none may come
                # back to it (it would refuse them) while it waits for them to exit.
                handle.stopping = True
                self.scheduler.set_agent_enabled(agent_id, False)
                log.info("agent %s is shutting down: nothing more is placed on it", agent_id)

    def disconnected(self, agent_id: str, handle: AgentHandle | None, *, keep: bool) -> bool:
        """The stream of `handle` ended (a newer connection of the agent is kept); True
        if that was the agent's current connection. With `keep`, its slots wait for it,
        disabled; without, the caller drops it."""
        current = self.agents.get(agent_id)
        if current is None or (handle is not None and current is not handle):
            return False
        if not current.connected:
            return False
        current.connected = False
        current.disconnected_at = time.monotonic()
        current.outbox.put(None)
        self._count(current, -1)
        if keep:
            self.scheduler.set_agent_enabled(agent_id, False)  # no new work meanwhile
            self._batch().agent_state(agent_id, "DISCONNECTED")
        return True

    def drop(self, agent_id: str) -> list[str]:
        """Forget the agent; the requests that had slots on it (the gang's other parts
        keep theirs until their processes are gone)."""
        dropped = self.agents.pop(agent_id, None)
        if dropped is not None and dropped.connected:
            dropped.outbox.put(None)  # close its stream; it may register again
            self._count(dropped, -1)
        self._batch().agent_state(agent_id, "DISCONNECTED")
        return self.scheduler.remove_agent(agent_id, keep_other_parts=True)

    def withdraw(self, agent_id: str, credential: str) -> None:
        """Forget `credential`, issued to an agent that hung up before it was told it: the
        name is free again for the join token (unless it holds another one by now)."""
        digest = credential_digest(credential)
        if self._credentials.get(agent_id) == digest:
            del self._credentials[agent_id]
            self._batch().agent_credential_withdrawn(agent_id, digest)

    def forget(self, agent_id: str) -> None:
        """Forget the agent's credential and row (the caller then drops the agent, if it
        is connected or awaited): its name is free for the next agent with the join token."""
        if agent_id not in self._credentials and agent_id not in self.agents:
            raise NotFoundError(f"no agent named {agent_id!r} holds a credential or is connected")
        self._credentials.pop(agent_id, None)
        self._batch().agent_removed(agent_id)

    def set_enabled(self, agent_id: str, enabled: bool, *, drain: bool = False) -> None:
        """Enable or disable placement on the agent; `drain` marks a disable whose running
        trials are left to finish (the caller stops them otherwise)."""
        handle = self.agents.get(agent_id)
        if handle is None:
            raise NotFoundError(f"agent {agent_id!r} is not connected")
        handle.enabled = enabled
        handle.draining = drain and not enabled
        self.scheduler.set_agent_enabled(agent_id, enabled)
        self._batch().agent_state(agent_id, "ACTIVE" if enabled else "DISABLED")

    def clocks(self) -> list[AgentClock]:
        return [
            AgentClock(a.id, a.connected, a.last_heartbeat, a.disconnected_at)
            for a in self.agents.values()
        ]

    def send(self, agent_id: str, message: AgentMessage) -> None:
        """Queue `message` for the agent once the changes recorded so far are committed."""
        handle = self.agents.get(agent_id)
        if handle is not None:
            outbox = handle.outbox
            self._after_commit(lambda: outbox.put(message))

    def kill(self, run: Run, *, graceful: bool) -> None:
        """Kill the run's processes on every agent that has not reported them gone."""
        kill = KillRun(run.allocation_id, graceful, self._kill_grace_s)
        for agent_id in run.agents:
            handle = self.agents.get(agent_id)
            if agent_id not in run.exit_codes and handle is not None and handle.connected:
                self.send(agent_id, kill)

    def close_streams(self) -> None:
        for handle in self.agents.values():
            handle.outbox.put(None)

    def addresses(self, agent_ids: Iterable[str]) -> dict[str, str]:
        return {a: self.agents[a].address for a in agent_ids}
