"""kopf peering read as kopf reads it: whether a replica must pause in favour of a peer (pure).

kopf's replicas publish keep-alives in the status of a (Cluster)KopfPeering object, one entry per
replica: ``{identity: {priority, lifetime, lastseen}}``. A replica pauses while some other live
entry has a priority higher than its own or the same (kopf then pauses every replica that shares
it); an entry is live until ``lastseen + lifetime``. kopf applies this rule to its watch streams;
the operator applies the same rule to what kopf does not stop, its own timers and pollers
(triton_operator.adapters.peering feeds the verdict to the Reconciler's pause gate).
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
from collections.abc import Mapping
from typing import Any

DEFAULT_LIFETIME_SECONDS = 60
"""kopf's lifetime of an entry that names none."""


@dataclasses.dataclass(frozen=True)
class Peer:
    identity: str
    priority: int
    deadline: datetime.datetime
    """When its keep-alive runs out: lastseen + lifetime."""


@dataclasses.dataclass(frozen=True)
class PeeringVerdict:
    """Whether this replica is paused, in favour of whom, and when to look again without news."""

    paused: bool
    blockers: tuple[Peer, ...] = ()
    """The live peers of a higher or the same priority."""
    recheck_after: float | None = None
    """Seconds until the first blocker's keep-alive runs out (the verdict may change then)."""
    reason: str = ""

    @property
    def message(self) -> str:
        if self.reason:
            return self.reason
        if not self.blockers:
            return "no live peer of a higher or the same priority"
        return "in favour of " + ", ".join(f"{p.identity} (priority {p.priority})" for p in self.blockers)


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _time(value: Any, now: datetime.datetime) -> datetime.datetime:
    if not isinstance(value, str):
        return now
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return now
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)


def parse_peers(status: Mapping[str, Any] | None, now: datetime.datetime) -> list[Peer]:
    """The entries of a peering object's status, with kopf's defaults for missing fields."""
    peers = []
    for identity, info in (status or {}).items():
        if not isinstance(info, Mapping):
            continue  # a removed entry (null) or something that is not kopf's
        lifetime = _int(info.get("lifetime"), DEFAULT_LIFETIME_SECONDS)
        lastseen = _time(info.get("lastseen"), now)
        peers.append(
            Peer(
                identity=str(identity),
                priority=_int(info.get("priority"), 0),
                deadline=lastseen + datetime.timedelta(seconds=lifetime),
            )
        )
    return peers


def peering_verdict(
    statuses: list[Mapping[str, Any] | None], *, identity: str, priority: int, now: datetime.datetime
) -> PeeringVerdict:
    """Whether the replica ``identity`` of ``priority`` pauses, given the status of every peering
    object it follows (kopf follows one cluster-wide, or one per served namespace, and pauses when
    any of them says so)."""
    blockers = [
        peer
        for status in statuses
        for peer in parse_peers(status, now)
        if peer.identity != identity and peer.deadline > now and peer.priority >= priority
    ]
    if not blockers:
        return PeeringVerdict(paused=False)
    first = min(peer.deadline for peer in blockers)
    unique = {(p.identity, p.priority): p for p in sorted(blockers, key=lambda p: (-p.priority, p.identity))}
    return PeeringVerdict(
        paused=True,
        blockers=tuple(unique.values()),
        recheck_after=max((first - now).total_seconds(), 0.0),
    )


GLOB_CHARACTERS = frozenset("*?[!,")


def is_pattern(namespace: str) -> bool:
    """Whether a --namespace value is a kopf pattern (globs, exclusions, lists) rather than a name."""
    return any(c in GLOB_CHARACTERS for c in namespace)


def match_namespace(name: str, pattern: str) -> bool:
    """kopf's namespace pattern match: comma-separated globs, ``!`` excludes, a leading exclusion
    implies a catch-all first (kopf._cogs.structs.references.match_namespace)."""
    globs = [glob.strip() for glob in pattern.split(",")]
    if not globs or globs[0].startswith("!"):
        globs.insert(0, "*")
    matches = first = fnmatch.fnmatchcase(name, globs[0])
    for glob in globs[1:]:
        if glob.startswith("!"):
            matches = matches and not fnmatch.fnmatchcase(name, glob[1:])
        else:
            matches = matches or (first and fnmatch.fnmatchcase(name, glob))
    return matches
