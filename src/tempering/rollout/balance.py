"""Which inference server takes the next request: load spreading, marking down, probing.

:class:`ServerPool` is the policy alone (no HTTP: ``tempering.rollout.remote`` does the
talking), so that it can be tested with a clock in hand:

- **Load.** :meth:`ServerPool.acquire` gives the server with the fewest requests in flight
  among those up (ties to the first listed), and counts one more in flight on it until
  :meth:`ServerPool.release`. A slow server holds its requests longer and so gets fewer new
  ones; equal servers share a step's requests evenly.
- **Down.** A server that stopped answering (no connection, a timeout) is marked down
  (:meth:`ServerPool.mark_down`): it gets no request until it is brought back. Its request is
  the caller's to send again elsewhere.
- **Probes.** A down server is due for a probe ``probe_s`` seconds after it went down, then
  after each failed probe twice as long as before, at most ``max_probe_s`` (:meth:`due`,
  :meth:`probe_failed`). A probe is claimed by one caller at a time (:meth:`claim`); the
  caller checks the server's health and reloads the current weights onto it before
  :meth:`bring_back` puts it in service, so a server never answers a request with weights
  other than the run's.
- **All down.** :meth:`all_down_for` is how long no server has been up (None while one is);
  the caller turns it into an error after its own limit.

Counters per server (requests completed, times marked down, times brought back, the policy
version it stated at its last check) are what the run logs; they count from this process's
start (a resumed run starts them again).

Not done: weighting servers by measured speed or capacity (in-flight counts stand in for
both), a circuit breaker for servers that answer errors (a server that answers is up; its
errors are the caller's retries), probing in the background (probes run when a caller asks).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass
class ServerState:
    """One server as the pool sees it."""

    url: str
    in_flight: int = 0
    up: bool = True
    probing: bool = False
    """A caller claimed its probe and has not reported back."""
    next_probe: float = 0.0
    """Clock time (seconds) from which a down server is due for a probe."""
    failed_probes: int = 0
    completed: int = 0
    downs: int = 0
    returns: int = 0
    checks: int = 0
    """Times its policy version was asked for (once a step while it is up)."""
    version: Optional[int] = None
    """The policy version the server stated at its last check; None = not stated."""
    error: str = ""
    """Why it was last marked down or failed a probe."""


class ServerPool:
    """Load spreading and failover state over ``urls`` (see the module docstring); thread-safe.
    ``clock`` (seconds, monotonic) is replaceable for tests."""

    def __init__(self, urls: list[str], probe_s: float, max_probe_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.servers = [ServerState(url) for url in urls]
        self.probe_s, self.max_probe_s, self.clock = probe_s, max_probe_s, clock
        self.resent = 0
        """Requests sent again to another server after theirs stopped answering."""
        self._all_down_since: Optional[float] = None
        self._cond = threading.Condition()

    def _state(self, url: str) -> ServerState:
        return next(s for s in self.servers if s.url == url)

    def acquire(self) -> Optional[str]:
        """The up server with the fewest requests in flight (the first listed among equals),
        now holding one more; None when none is up."""
        with self._cond:
            up = [s for s in self.servers if s.up]
            if not up:
                return None
            chosen = min(up, key=lambda s: s.in_flight)
            chosen.in_flight += 1
            return chosen.url

    def release(self, url: str, completed: bool = True) -> None:
        """A request acquired on ``url`` is over (``completed``: it was answered)."""
        with self._cond:
            state = self._state(url)
            state.in_flight -= 1
            state.completed += completed
            self._cond.notify_all()

    def mark_down(self, url: str, error: str, held: bool = True) -> None:
        """``url`` stopped answering (``held``: the caller's request on it is over, to be sent
        again elsewhere, and counted in ``resent``); a server already down stays as it was."""
        with self._cond:
            state = self._state(url)
            state.in_flight -= held
            self.resent += held
            if state.up:
                now = self.clock()
                state.up, state.error, state.downs = False, error, state.downs + 1
                state.failed_probes, state.next_probe = 0, now + self.probe_s
                if not any(s.up for s in self.servers):
                    self._all_down_since = now
            self._cond.notify_all()

    def due(self) -> list[str]:
        """Down servers due for a probe that nobody has claimed."""
        now = self.clock()
        with self._cond:
            return [s.url for s in self.servers if not s.up and not s.probing and s.next_probe <= now]

    def claim(self, url: str) -> bool:
        """Whether this caller is to probe ``url`` (no other caller is, and it is still down)."""
        with self._cond:
            state = self._state(url)
            if state.up or state.probing:
                return False
            state.probing = True
            return True

    def probe_failed(self, url: str, error: str) -> None:
        """The claimed probe of ``url`` failed: due again after twice the last wait (capped)."""
        with self._cond:
            state = self._state(url)
            state.probing, state.error = False, error
            state.failed_probes += 1
            wait = min(self.probe_s * 2 ** state.failed_probes, self.max_probe_s)
            state.next_probe = self.clock() + wait
            self._cond.notify_all()

    def bring_back(self, url: str, version: Optional[int]) -> None:
        """The claimed probe of ``url`` found it healthy and at the run's weights (``version``)."""
        with self._cond:
            state = self._state(url)
            state.probing, state.up, state.version = False, True, version
            state.returns += 1
            self._all_down_since = None
            self._cond.notify_all()

    def checked(self, url: str, version: Optional[int]) -> None:
        """``url`` stated ``version`` at this step's check."""
        with self._cond:
            state = self._state(url)
            state.version, state.checks = version, state.checks + 1

    def up(self) -> list[str]:
        with self._cond:
            return [s.url for s in self.servers if s.up]

    def all_down_for(self) -> Optional[float]:
        """Seconds since the last server went down, while none is up; None while one is."""
        with self._cond:
            return None if self._all_down_since is None else self.clock() - self._all_down_since

    def next_due_in(self) -> float:
        """Seconds until the next down server is due for a probe (0 when one is due now)."""
        now = self.clock()
        with self._cond:
            waits = [s.next_probe - now for s in self.servers if not s.up]
            return max(0.0, min(waits, default=0.0))

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, less when a server changes state."""
        with self._cond:
            self._cond.wait(seconds)

    def record(self) -> dict[str, float]:
        """The step-record keys: per server (by its place in the list) ``server/<i>/up``,
        ``/requests`` (completed), ``/downs``, ``/returns``, ``/checks`` and ``/version`` (when
        stated), and ``server/resent``."""
        with self._cond:
            record: dict[str, float] = {"server/resent": self.resent}
            for i, s in enumerate(self.servers):
                record.update({f"server/{i}/up": int(s.up), f"server/{i}/requests": s.completed,
                               f"server/{i}/downs": s.downs, f"server/{i}/returns": s.returns,
                               f"server/{i}/checks": s.checks})
                if s.version is not None:
                    record[f"server/{i}/version"] = s.version
            return record

    def describe_down(self) -> str:
        """Each down server and its last error, for a message."""
        with self._cond:
            return "; ".join(f"{s.url}: {s.error}" for s in self.servers if not s.up)
