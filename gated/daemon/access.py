"""Who may do what on the socket: the client's SO_PEERCRED identity against ``[access]``.

The socket's file mode and group decide who can connect at all. Within that, the
``[access]`` allow-lists split the ops in two classes (docs/operations.md, "Security
model"):

- **signal ops**: every op that changes the model -- ``signal`` and ``signals`` (they
  train it, so whoever may send them can steer every later decision of the gate),
  ``rollback`` and ``resume`` (they change what serves), and any op added later that is
  not listed below (fail closed) -- typically only the gateway's user;
- **predict ops** (``predict``, ``explain``, ``status``): they only ask.

``ping`` is open to every client. A class whose uid and gid lists are both empty is open
to every client (the behaviour before the lists existed). Otherwise a client may use it
when its uid is listed or its primary or one of its supplementary groups is. The identity
is the kernel's, taken when the client connected (``SO_PEERCRED``, ``SO_PEERGROUPS``):
a client cannot claim another one.
"""

from __future__ import annotations

import grp
import pwd
from dataclasses import dataclass

from ..config import AccessConfig
from .connections import Peer

PREDICT_OPS = frozenset({"predict", "explain", "status"})
OPEN_OPS = frozenset({"ping"})


#: Every other op is a signal op: it changes the model (signal, signals, rollback, resume).
def _resolve(names: tuple, kind: str, key: str) -> frozenset[int]:
    out = set()
    for x in names:
        if isinstance(x, int):
            out.add(x)
            continue
        try:
            out.add(pwd.getpwnam(x).pw_uid if kind == "user" else grp.getgrnam(x).gr_gid)
        except KeyError:
            raise ValueError(f"access.{key}: there is no {kind} named {x!r} on this host; "
                             f"use an existing {kind} name or a numeric id") from None
    return frozenset(out)


def _identity_mapped() -> bool:
    """True unless this process runs in a user namespace that maps only some ids (then
    every other user's connection shows as the overflow uid 65534)."""
    try:
        with open("/proc/self/uid_map") as f:
            lines = f.read().split()
    except OSError:
        return True
    return lines == ["0", "0", "4294967295"]


@dataclass(frozen=True)
class AccessPolicy:
    signal_uids: frozenset[int] = frozenset()
    signal_gids: frozenset[int] = frozenset()
    predict_uids: frozenset[int] = frozenset()
    predict_gids: frozenset[int] = frozenset()

    @classmethod
    def from_config(cls, acc: AccessConfig) -> AccessPolicy:
        """Resolve names to ids; ValueError (with what to do) when a name is unknown or
        the lists could not be enforced."""
        policy = cls(_resolve(acc.signal_uids, "user", "signal_uids"),
                     _resolve(acc.signal_gids, "group", "signal_gids"),
                     _resolve(acc.predict_uids, "user", "predict_uids"),
                     _resolve(acc.predict_gids, "group", "predict_gids"))
        if not policy.is_open() and not _identity_mapped():
            raise ValueError(
                "[access] lists are set, but this process runs in a user namespace that "
                "does not map every user (systemd's PrivateUsers=yes): every other user's "
                "connection would show as uid 65534 and the lists could not tell the "
                "gateway from anyone else. Set PrivateUsers=no for gated.service (the "
                "shipped unit does), or empty the [access] lists")
        return policy

    def is_open(self) -> bool:
        return not (self.signal_uids or self.signal_gids or self.predict_uids
                    or self.predict_gids)

    def _lists(self, op: str) -> tuple[str, frozenset[int], frozenset[int]] | None:
        if op in OPEN_OPS:
            return None
        if op in PREDICT_OPS:
            return "predict", self.predict_uids, self.predict_gids
        return "signal", self.signal_uids, self.signal_gids

    def allows(self, op: str, peer: Peer | None) -> bool:
        lists = self._lists(op)
        if lists is None:
            return True
        _, uids, gids = lists
        if not uids and not gids:
            return True
        if peer is None:
            return False
        return peer.uid in uids or not gids.isdisjoint(peer.gids())

    def refusal(self, op: str, peer: Peer | None) -> str:
        """The `forbidden` message: what was refused, why, what to do."""
        lists = self._lists(op)
        cls = lists[0] if lists else "?"
        who = str(peer) if peer is not None else "a client whose credentials the kernel " \
                                                  "did not give"
        stored = " Nothing was stored or changed." if cls == "signal" else ""
        return (f"{op} is not allowed for {who}: the daemon's [access] {cls}_uids / "
                f"{cls}_gids do not list this user or any of its groups.{stored} The "
                f"operator can add it to access.{cls}_uids or access.{cls}_gids (a hot "
                "key: reload, no restart)")
