"""Login limits of the wire server and the console: backoff, guess pacing, login slots.

Failed logins are counted per user name and client address; a stranger can slow
logins from their own address, never refuse a right password (see
docs/server.md, "Login limits"). The exchange itself is :mod:`dpsql.passwords`'s.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# -- failed-login backoff -------------------------------------------------------------------


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    until: float = 0.0  # a pair's refusal or held answer, an address's hold, ends then


class LoginBackoff:
    """Failed logins, counted per (user name, client address) and per address over all names.

    After ``free`` failures in a row a pair waits ``base`` seconds, doubling with
    each further failure up to ``ceiling``; a success, or ``forget`` seconds
    without a failure, clears it. After ``free_per_host`` failures of an
    address over all names, each further one waits :meth:`hold` seconds
    (``base``, doubling up to ``hold_ceiling``). Every name counts, known or not,
    so what follows a failure tells nothing about which users exist.

    The wire server never refuses a login for failures: it checks every proof,
    lets a right one in at once, and answers a wrong one only after
    :meth:`delay`, the longer of the pair's wait and the address's hold. The
    console refuses a pair while :meth:`wait` is above 0 (an address's failures
    refuse nobody there either).

    At most ``capacity`` pairs and addresses are kept, the least recently
    failed dropped first, so a flood of names cannot exhaust memory. Not
    thread-safe (the wire server uses it from its event loop; the console
    under a lock).
    """

    def __init__(self, *, free: int = 5, free_per_host: int = 50, base: float = 1.0,
                 ceiling: float = 300.0, hold_ceiling: float = 5.0, forget: float = 900.0,
                 capacity: int = 10_000, clock: Callable[[], float] | None = None) -> None:
        self.free = free
        self.free_per_host = free_per_host
        self.base = base
        self.ceiling = ceiling
        self.hold_ceiling = hold_ceiling
        self.forget = forget
        self.capacity = capacity
        self._clock = clock or time.monotonic
        self._failures: OrderedDict[tuple[str | None, str], _Failures] = OrderedDict()

    def _current(self, key: tuple[str | None, str]) -> _Failures | None:
        entry = self._failures.get(key)
        if entry is not None and self._clock() - entry.last > self.forget:
            del self._failures[key]
            return None
        return entry

    def wait(self, user: str, host: str) -> float:
        """Seconds before ``user`` may try again from ``host`` (0: now): its own failures only."""
        entry = self._current((user, host))
        return max(0.0, entry.until - self._clock()) if entry is not None else 0.0

    def hold(self, host: str) -> float:
        """Seconds to hold the answer to a failed login from ``host`` (0: none)."""
        entry = self._current((None, host))
        return max(0.0, entry.until - self._clock()) if entry is not None else 0.0

    def delay(self, user: str, host: str) -> float:
        """Seconds to hold the answer to the failure of ``user`` from ``host`` just counted.

        The longer of the pair's wait and the address's hold, at most ``hold_ceiling``.
        """
        return min(self.hold_ceiling, max(self.wait(user, host), self.hold(host)))

    def failures(self, user: str | None, host: str) -> int:
        """Failures in a row of ``user`` from ``host`` (``user`` None: of the address)."""
        entry = self._current((user, host))
        return entry.count if entry is not None else 0

    def failed(self, user: str, host: str) -> None:
        """Record a failed login (call it before :meth:`hold`, which then counts it).

        The pair's wait starts when the held answer is given, not before.
        """
        now = self._clock()
        address = self._count((None, host), now, now, self.free_per_host, self.hold_ceiling)
        self._count((user, host), now, max(now, address.until), self.free, self.ceiling)
        while len(self._failures) > self.capacity:
            self._failures.popitem(last=False)

    def _count(self, key: tuple[str | None, str], now: float, start: float, free: int,
               ceiling: float) -> _Failures:
        """Count a failure of ``key``; past ``free`` of them, it waits from ``start`` on."""
        entry = self._current(key) or _Failures()
        entry.count += 1
        entry.last = now
        if entry.count >= free:
            entry.until = start + min(ceiling, self.base * 2.0 ** min(entry.count - free, 64))
        self._failures[key] = entry
        self._failures.move_to_end(key)
        return entry

    def succeeded(self, user: str, host: str) -> None:
        """A login succeeded: forget the pair's failures (the address's stay)."""
        self._failures.pop((user, host), None)


# -- the pace of guesses -----------------------------------------------------------------------


@dataclass
class _Bucket:
    tokens: float
    stamp: float  # when ``tokens`` was counted


class GuessGate:
    """When a proof of a name may be checked: at most so many failures of a name a second.

    Each name (known or not, over all addresses) holds ``per_name`` tokens,
    refilled at ``name_rate`` a second. A failed proof spends one (down to as
    far below zero as the bucket's size). A proof is checked when its name has
    one (:meth:`turn` is 0); until then it waits, but the server checks it
    anyway after a bounded wait, so a right password always gets in. A success
    spends nothing. At most ``capacity`` names are kept, the least recently
    spent dropped first (as if full again). Not thread-safe (the event loop's).
    """

    def __init__(self, *, per_name: int = 5, name_rate: float = 1.0, capacity: int = 10_000,
                 clock: Callable[[], float] | None = None) -> None:
        self.size = float(per_name)
        self.rate = name_rate
        self.capacity = capacity
        self._clock = clock or time.monotonic
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def _tokens(self, user: str, now: float) -> float:
        bucket = self._buckets.get(user)
        if bucket is None:
            return self.size
        return min(self.size, bucket.tokens + (now - bucket.stamp) * self.rate)

    def turn(self, user: str) -> float:
        """Seconds until a proof of ``user`` may be checked (0: now)."""
        tokens = self._tokens(user, self._clock())
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def spend(self, user: str) -> None:
        """A proof of ``user`` was checked and failed."""
        now = self._clock()
        self._buckets[user] = _Bucket(max(-self.size, self._tokens(user, now) - 1), now)
        self._buckets.move_to_end(user)
        while len(self._buckets) > self.capacity:
            self._buckets.popitem(last=False)


# -- login slots -----------------------------------------------------------------------------


@dataclass
class _Slot:
    host: str
    state: str
    since: float  # when it entered ``state``
    order: int  # ties of ``since``: the later, the larger
    spoke: bool = False  # its client has sent a message


class LoginSlots:
    """The ``total`` slots of the connections still logging in, none kept for an idle one.

    A connection holds one from accept until it has logged in, closed or gone
    to wait for its turn (the server's :class:`GuessGate`), and is always in
    one state: waiting for its client's next message (CLIENT), its failure's
    answer held back (HELD), or the server working for it (SERVER). When all
    are taken, a newcomer gets the slot of a connection dropped to make room
    (:meth:`_rank`): one whose failure's answer is held (it is given at once),
    else one silent for more than ``grace`` seconds since it connected, else
    the one that has waited longest for its client (a client answers within a
    round trip; an idle socket only gets older). Only when every slot is the
    server's own work is a newcomer refused. There is no share per address:
    clients of 127.0.0.1 or behind one NAT share one, and a burst of them must
    all get in. Used from the event loop only.
    """

    CLIENT = "client"
    HELD = "held"
    SERVER = "server"

    def __init__(self, total: int, grace: float = 0.25,
                 clock: Callable[[], float] | None = None) -> None:
        self.total = total
        self.grace = grace
        self._clock = clock or time.monotonic
        self._slots: dict[int, _Slot] = {}  # pid -> its slot
        self._order = 0

    def take(self, pid: int, host: str,
             heard: Callable[[int], bool] | None = None) -> list[int] | None:
        """Give connection ``pid`` from ``host`` a slot (waiting for its client).

        Returns the pids dropped to make room (their slots are already free: drop
        those connections), or None when every slot is the server's work.
        ``heard(pid)`` tells whether a connection's next message has arrived and
        waits to be read: the server is behind, not the client, so it is kept.
        """
        dropped = []
        if len(self._slots) >= self.total:
            victim = self._victim(heard or (lambda pid: False))
            if victim is None:
                return None
            del self._slots[victim]
            dropped.append(victim)
        self._slots[pid] = _Slot(host, self.CLIENT, 0.0, 0)
        self.mark(pid, self.CLIENT)
        return dropped

    def mark(self, pid: int, state: str) -> None:
        """``pid`` enters ``state`` now (nothing if it holds no slot)."""
        slot = self._slots.get(pid)
        if slot is not None:
            self._order += 1
            slot.state, slot.since, slot.order = state, self._clock(), self._order
            slot.spoke = slot.spoke or state != self.CLIENT

    def _victim(self, heard: Callable[[int], bool]) -> int | None:
        """The connection to drop: the first of the lowest rank (see :meth:`_rank`), or None."""
        now = self._clock()
        ranked = [(rank, pid) for pid, slot in self._slots.items()
                  if (rank := self._rank(slot, now, heard(pid))) is not None]
        return min(ranked)[1] if ranked else None

    def _rank(self, slot: _Slot, now: float, heard: bool) -> tuple[int, float, int] | None:
        """Where ``slot`` stands in line to be dropped (lowest first; None: never).

        The held, oldest first; those silent since they connected, more than
        ``grace`` seconds ago, oldest first; the others waiting for their client,
        oldest first (a client just connected is the newest). A client whose
        message has come and waits to be read is the server's turn.
        """
        if slot.state == self.HELD:
            return (0, slot.since, slot.order)
        if slot.state == self.CLIENT and not heard:
            idle = not slot.spoke and now - slot.since > self.grace
            return (1 if idle else 2, slot.since, slot.order)
        return None

    def release(self, pid: int) -> None:
        """Free ``pid``'s slot (logged in or closed); nothing if it holds none."""
        self._slots.pop(pid, None)

    def held(self, host: str | None = None) -> int:
        """Slots held now, in all or by ``host``."""
        return sum(1 for slot in self._slots.values() if host is None or slot.host == host)

    def state(self, pid: int) -> str | None:
        """The state of ``pid``'s slot, or None when it holds none."""
        slot = self._slots.get(pid)
        return slot.state if slot is not None else None
