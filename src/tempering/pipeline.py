"""Where rollouts come from: workers, their placement, and the synchronous or asynchronous loop.

Two workers with small interfaces do the work between the scheduler and the learner:

- :class:`RolloutWorker` samples groups for problems (``sample``) with any
  :class:`~tempering.rollout.base.Generator` (a Hugging Face model in this process, or
  another sampler that keeps the protocol), takes new weights by version
  (``set_weights``), and owns its RNG;
- :class:`RewardWorker` scores groups in place (``score``) and owns the reward
  normalizer's statistics.

They are plain classes. A *handle* places one: :class:`LocalHandle` calls it in this
process; :class:`RayHandle` runs it as a Ray actor (a named one, so operators and tests can
find it), restarts it when it dies and re-issues the call that was in flight, up to
``restart_limit`` times.

:class:`Pipeline` turns them into *rounds*: ``prompts`` problems drawn from the scheduler,
sampled, scored and observed by the scheduler; the learner asks for them one at a time
(``next_round``), each with what it cost. In ``sync`` mode a round is made when the
learner asks for it, with the learner's current weights (staleness 0). In ``async`` mode a
feeder thread keeps up to ``buffer_rounds`` rounds ready while the learner trains; new
weights reach the rollout worker between rounds, so a round can be older than the learner
by a few versions. Rounds older than ``max_staleness`` versions are dropped and counted
(``dropped_stale``); younger stale ones are trained with the learner's off-policy
correction. Every rollout carries the version that sampled it.

State: ``state_dict`` holds the buffered rounds (sampled and scored, not yet trained on),
the rollout worker's RNG, the reward normalizer and the counters; in async mode it is
taken with the feeder paused between rounds, so nothing is in flight.

Several workers of a kind share a round through a :class:`WorkerPool`: problems (or groups)
are cut into contiguous shares, one per worker, called at once; weights go to every worker.
On Ray, a placement group can reserve every actor's CPUs and GPUs before any starts
(:func:`placement_group`).
An OpenAI-compatible inference server is a generator (``tempering.rollout.openai_server``)
inside the rollout worker.
"""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from tempering import faults
from tempering.rollout.base import Generator, SamplingParams
from tempering.types import Group, Problem, Round


class RolloutWorker:
    """Samples groups with a :class:`~tempering.rollout.base.Generator` and owns its random stream."""

    def __init__(self, generator: Generator, sampling: SamplingParams, group_size: int, seed: int):
        self.generator = generator
        self.sampling, self.group_size = sampling, group_size
        self.rng = torch.Generator().manual_seed(seed)
        self.version = 0

    def sample(self, problems: list[Problem]) -> list[Group]:
        faults.point("sample")
        return self.generator.generate(problems, self.group_size, self.sampling, self.version, self.rng)

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> float:
        """Load new policy weights; return the seconds it took."""
        start = time.perf_counter()
        self.generator.load_weights(weights)  # empty when the generator shares the learner's tensors
        self.version = version
        return time.perf_counter() - start

    def reseed(self, salt: int) -> None:
        """A fresh random stream after a restart, so a restarted worker does not repeat itself."""
        self.rng.manual_seed(self.rng.initial_seed() * 1000003 + salt)

    def state_dict(self) -> dict:
        return {"rng": self.rng.get_state(), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.rng.set_state(state["rng"])

    def close(self) -> None:
        """Release what the generator holds: a server it started, an engine in this process."""
        if hasattr(self.generator, "close"):
            self.generator.close()


class RewardWorker:
    """Scores groups in place with the tasks' rewards."""

    def __init__(self, rewarder: Any):
        self.rewarder = rewarder

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        record = self.rewarder.score(groups)
        return groups, record

    def state_dict(self) -> dict:
        return self.rewarder.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.rewarder.load_state_dict(state)

    def close(self) -> None:
        self.rewarder.close()


class LocalHandle:
    """A worker called directly in this process."""

    def __init__(self, worker: Any):
        self.worker = worker
        self.restarts = 0

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)

    def close(self) -> None:
        if hasattr(self.worker, "close"):
            self.worker.close()


class RayHandle:
    """A worker run as a named Ray actor, restarted (and the call re-issued) when it dies.

    ``build(*args)`` makes the worker inside the actor (a module-level function, so Ray can
    ship it by name); after a restart, ``on_restart(handle)`` brings the new actor up to date
    (weights, statistics).
    """

    def __init__(self, build: Callable[..., Any], args: tuple, name: str, restart_limit: int,
                 num_cpus: float = 1.0, on_restart: Optional[Callable[["RayHandle"], None]] = None,
                 num_gpus: float = 0.0, placement: Any = None):
        import ray

        self._ray = ray
        self.build, self.args, self.name = build, args, name
        self.restart_limit, self.num_cpus, self.on_restart = restart_limit, num_cpus, on_restart
        self.num_gpus, self.placement = num_gpus, placement
        self.restarts = 0
        self.actor = self._start()

    def _start(self):
        name = self.name if not self.restarts else f"{self.name}-restart{self.restarts}"
        options: dict[str, Any] = {}
        if self.placement is not None:  # (group, bundle): a restarted actor takes the same bundle
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            group, bundle = self.placement
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, bundle)
        remote = self._ray.remote(_ActorShell).options(name=name, num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                                        max_concurrency=1, lifetime=None, **options)
        actor = remote.remote(self.build, self.args)
        self._ray.get(actor.call.remote("ping"))
        return actor

    def call(self, method: str, *args: Any) -> Any:
        while True:
            try:
                return self._ray.get(self.actor.call.remote(method, *args))
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.ActorUnavailableError):
                if self.restarts >= self.restart_limit:
                    raise
                self.restarts += 1
                self._kill_quietly()
                self.actor = self._start()
                if self.on_restart is not None:
                    self.on_restart(self)

    def _kill_quietly(self) -> None:
        try:
            self._ray.kill(self.actor)
        except Exception:  # already gone
            pass

    def close(self) -> None:
        try:
            self._ray.get(self.actor.call.remote("close"))
        except Exception:
            pass
        self._kill_quietly()


class WorkerPool:
    """Several handles of one kind of worker, called like one: ``sample`` and ``score`` give
    each worker a contiguous share of their list and join the answers in order; other calls
    go to every worker (``set_weights`` returns the slowest's seconds; ``state_dict`` a list)."""

    def __init__(self, handles: list[Any]):
        self.handles = handles
        self._threads = ThreadPoolExecutor(len(handles), thread_name_prefix="workers")

    @property
    def restarts(self) -> int:
        return sum(h.restarts for h in self.handles)

    @property
    def on_restart(self) -> Any:
        return self.handles[0].on_restart

    @on_restart.setter
    def on_restart(self, refresh: Any) -> None:
        for handle in self.handles:
            handle.on_restart = refresh

    def _each(self, method: str, args_per_worker: list[tuple]) -> list[Any]:
        futures = [self._threads.submit(h.call, method, *args) for h, args in zip(self.handles, args_per_worker)]
        return [f.result() for f in futures]

    def call(self, method: str, *args: Any) -> Any:
        if method in ("sample", "score"):
            shares = [args[0][s] for s in _shares(len(args[0]), len(self.handles))]
            answers = self._each(method, [(share,) for share in shares])
            if method == "sample":
                return [group for groups in answers for group in groups]
            return [g for groups, _ in answers for g in groups], merge_records(answers)
        if method == "load_state_dict":
            return self._each(method, [(state,) for state in args[0]])
        answers = self._each(method, [args] * len(self.handles))
        return max(answers) if method == "set_weights" else answers

    def close(self) -> None:
        for handle in self.handles:
            handle.close()
        self._threads.shutdown()


def _shares(count: int, parts: int) -> list[slice]:
    """``parts`` contiguous slices of ``range(count)``, the first ones a row longer when uneven."""
    size, extra = divmod(count, parts)
    starts = [i * size + min(i, extra) for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(starts, starts[1:])]


def merge_records(answers: list[tuple[list[Group], dict[str, float]]]) -> dict[str, float]:
    """Reward records of shares as the record of the whole: means weighted by the rollouts each
    share kept (a key a share lacks summed 0 there), counts (``reward/dropped``, ``/errors``) added.

    >>> merge_records([([Group(None, [1, 2, 3])], {"reward": 1.0, "reward/dropped": 1}),
    ...                ([Group(None, [4])], {"reward": 0.0, "reward/dropped": 2})])
    {'reward': 0.75, 'reward/dropped': 3}
    """
    kept = [sum(len(g.rollouts) for g in groups) for groups, _ in answers]
    total = max(sum(kept), 1)
    merged: dict[str, float] = {}
    for (_, record), count in zip(answers, kept):
        for key, value in record.items():
            share = value if key in COUNTED else value * count / total
            merged[key] = merged.get(key, 0) + share
    return merged


COUNTED = frozenset({"reward/dropped", "reward/errors"})
"""Reward record keys that count rollouts rather than average over them."""


class _ActorShell:
    """The one actor class: builds any worker with its builder and forwards calls to it."""

    def __init__(self, build: Callable[..., Any], args: tuple):
        self.worker = build(*args)

    def call(self, method: str, *args: Any) -> Any:
        if method == "ping" or (method == "close" and not hasattr(self.worker, "close")):
            return None
        return getattr(self.worker, method)(*args)


@dataclass
class Counters:
    rounds: int = 0
    rollouts_sampled: int = 0
    rollouts_taken: int = 0
    dropped_stale: int = 0
    weight_syncs: int = 0


class Pipeline:
    """Scored rounds for the learner, made on demand (sync) or ahead by a feeder thread (async)."""

    def __init__(self, mixture: Any, rollout: Any, reward: Any, prompts: int, mode: str = "sync",
                 max_staleness: int = 1, buffer_rounds: int = 1, shares_policy: bool = False):
        if mode not in ("sync", "async"):
            raise ValueError(f"pipeline mode {mode!r}; known: sync, async")
        self.mixture, self.rollout, self.reward = mixture, rollout, reward
        self.prompts, self.mode = prompts, mode
        self.max_staleness, self.buffer_rounds = max_staleness, buffer_rounds
        self.shares_policy = shares_policy
        self.counters = Counters()
        self.learner_version = 0
        self._buffer: deque[Round] = deque()
        self._pending: Optional[tuple[dict, int]] = None
        self._cond = threading.Condition()
        self._paused = False
        self._busy = False
        self._stop = False
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        self._last_weights: Optional[tuple[dict, int]] = None
        if hasattr(rollout, "on_restart"):
            rollout.on_restart = self._refresh_rollout

    def _refresh_rollout(self, handle: Any) -> None:
        """A restarted rollout worker: the newest weights, and a random stream of its own."""
        if self._last_weights is not None:
            handle.call("set_weights", *self._last_weights)
        handle.call("reseed", handle.restarts)

    # -- making rounds -------------------------------------------------------------------
    def _make_round(self) -> Round:
        sync_s = 0.0
        with self._cond:
            pending, self._pending = self._pending, None
        if pending is not None:
            sync_s = self.rollout.call("set_weights", *pending)
            self.counters.weight_syncs += 1
        with self._cond:
            problems = self.mixture.next_problems(self.prompts)
        version = pending[1] if pending is not None else None
        t0 = time.perf_counter()
        groups = self.rollout.call("sample", problems)
        t1 = time.perf_counter()
        groups, record = self.reward.call("score", groups)
        t2 = time.perf_counter()
        with self._cond:
            self.mixture.observe(groups)
        if version is None:
            version = groups[0].rollouts[0].policy_version if groups and groups[0].rollouts else self.learner_version
        count = sum(len(g.rollouts) for g in groups)
        self.counters.rounds += 1
        self.counters.rollouts_sampled += count
        return Round(groups, record, version, t1 - t0, t2 - t1, sync_s)

    def _feed(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stop or (not self._paused
                                                                and len(self._buffer) < self.buffer_rounds))
                    if self._stop:
                        return
                    self._busy = True
                try:
                    made = self._make_round()
                except BaseException:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
                    raise
                with self._cond:  # one step: a paused pipeline's snapshot never misses a made round
                    self._buffer.append(made)
                    self._busy = False
                    self._cond.notify_all()
        except BaseException as exc:  # surfaced to the learner's thread by next_round()
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def start(self) -> None:
        if self.mode == "async" and self._thread is None:
            self._thread = threading.Thread(target=self._feed, name="feeder", daemon=True)
            self._thread.start()

    def next_round(self) -> Round:
        """The next round fresh enough to train on: made now (sync) or taken from the buffer
        (async). Rounds more than ``max_staleness`` versions behind the learner are dropped
        and counted; the one returned carries its ``staleness``."""
        while True:
            if self.mode == "sync":
                made = self._buffer.popleft() if self._buffer else self._make_round()
            else:
                with self._cond:
                    self._cond.wait_for(lambda: self._buffer or self._error is not None)
                    if self._error is not None:
                        raise RuntimeError("the sampling thread failed") from self._error
                    made = self._buffer.popleft()
                    self._cond.notify_all()
            count = sum(len(g.rollouts) for g in made.groups)
            made.staleness = self.learner_version - made.version
            if made.staleness > self.max_staleness:
                self.counters.dropped_stale += count
                continue
            self.counters.rollouts_taken += count
            return made

    def publish(self, model: Any, version: int) -> float:
        """New learner weights: the rollout worker gets them now (sync) or before its next round
        (async). Returns the seconds spent here."""
        start = time.perf_counter()
        self.learner_version = version
        if self.shares_policy:
            self.rollout.call("set_weights", {}, version)  # same tensors: only the version moves
            return time.perf_counter() - start
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self._last_weights = (weights, version)
        if self.mode == "sync":
            self.rollout.call("set_weights", weights, version)
            self.counters.weight_syncs += 1
        else:
            with self._cond:
                self._pending = (weights, version)
        return time.perf_counter() - start

    @property
    def buffered(self) -> int:
        """Rollouts sampled and scored but not (yet) taken by the learner."""
        return sum(len(g.rollouts) for r in self._buffer for g in r.groups)

    def scheduler_lock(self) -> threading.Condition:
        """Held while the scheduler is read or changed (the feeder draws from it)."""
        return self._cond

    @property
    def restarts(self) -> int:
        return self.rollout.restarts + self.reward.restarts

    # -- state ---------------------------------------------------------------------------
    def pause(self) -> None:
        """Stop the feeder between rounds (async); returns once nothing is in flight."""
        with self._cond:
            self._paused = True
            self._cond.wait_for(lambda: not self._busy or self._error is not None)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def state_dict(self) -> dict:
        """Call with the feeder paused (async)."""
        return {"buffer": [copy.copy(r) for r in self._buffer], "rollout": self.rollout.call("state_dict"),
                "reward": self.reward.call("state_dict"), "counters": copy.deepcopy(self.counters)}

    def load_state_dict(self, state: dict) -> None:
        self._buffer = deque(state["buffer"])
        self.rollout.call("load_state_dict", state["rollout"])
        self.reward.call("load_state_dict", state["reward"])
        self.counters = state["counters"]

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        self.rollout.close()
        self.reward.close()
