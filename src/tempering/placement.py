"""Where workers run: in this process, or as Ray actors, alone or several of a kind.

The pipeline's workers (``tempering.pipeline``) are plain classes, and the pipeline calls
them through a *handle* typed by a small protocol, :class:`RolloutHandle` or
:class:`RewardHandle`. In this process a worker is its own handle (it never restarts);
:class:`RayRollout` and :class:`RayReward` run one as a Ray actor (a named one, so operators
and tests can find it), restart it when it dies and re-issue the call that was in flight, up
to ``restart_limit`` times. Their methods are the worker's; every ``.remote`` call stays in
this module.

Several workers of a kind share a round through a pool (:class:`RolloutPool`,
:class:`RewardPool`): problems (or groups) are cut into contiguous shares, one per worker,
called at once; weights go to every worker.
On Ray (joined or started by :func:`start_ray`), a placement group can reserve every actor's
CPUs and GPUs before any starts (:func:`actor_placement`).

Not here: which worker is built from the config (``tempering.build``), and what a round is
(``tempering.pipeline``).
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional, Protocol, runtime_checkable

from tempering.config import ConfigError, TrainConfig
from tempering.types import Group, Problem


@runtime_checkable
class RolloutHandle(Protocol):
    """The rollout side as the pipeline calls it: a worker in this process (the worker itself,
    ``tempering.pipeline.RolloutWorker``), one Ray actor (:class:`RayRollout`) or a pool of
    either (:class:`RolloutPool`). ``restarts``: how often its actors were restarted."""

    restarts: int

    def sample(self, problems: list[Problem]) -> list[Group]: ...

    def set_weights(self, weights: dict, version: int) -> float: ...

    def sampler_record(self) -> dict[str, float]: ...

    def reseed(self, salt: int) -> None: ...

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class RewardHandle(Protocol):
    """The reward side as the pipeline calls it: ``tempering.pipeline.RewardWorker`` in this
    process, one Ray actor (:class:`RayReward`) or a pool of either (:class:`RewardPool`)."""

    restarts: int

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]: ...

    def last_error(self) -> Optional[tuple[str, str]]: ...

    def probe(self, group: Group) -> Optional[tuple[str, str]]: ...

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...

    def close(self) -> None: ...


class RayHandle:
    """A worker run as a named Ray actor, restarted (and the call re-issued) when it dies.

    ``build(*args)`` makes the worker inside the actor (a module-level function, so Ray can
    ship it by name); after a restart, ``on_restart(handle)`` brings the new actor up to date
    (weights, statistics). The subclasses say which worker it is: their methods are the
    worker's, each one Ray call on the actor (``shell``, the actor's class).
    """

    shell: type
    restarts: int

    def __init__(self, build: Callable[..., Any], args: tuple, name: str, restart_limit: int,
                 num_cpus: float = 1.0, on_restart: Optional[Callable[[Any], None]] = None,
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
        remote = self._ray.remote(self.shell).options(name=name, num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                                       max_concurrency=1, lifetime=None, **options)
        actor = remote.remote(self.build, self.args)
        self._ray.get(actor.ping.remote())
        return actor

    def _get(self, call: Callable[[Any], Any]) -> Any:
        """The answer of ``call(actor)`` (a Ray object reference), a dead actor restarted and
        asked again, up to ``restart_limit`` times."""
        while True:
            try:
                return self._ray.get(call(self.actor))
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.ActorUnavailableError):
                if self.restarts >= self.restart_limit:
                    raise
                self.restarts += 1
                self._kill_quietly()
                self.actor = self._start()
                if self.on_restart is not None:
                    self.on_restart(self)

    def state_dict(self) -> Any:
        return self._get(lambda actor: actor.state_dict.remote())

    def load_state_dict(self, state: Any) -> None:
        self._get(lambda actor: actor.load_state_dict.remote(state))

    def _kill_quietly(self) -> None:
        try:
            self._ray.kill(self.actor)
        except Exception:  # already gone
            pass

    def close(self) -> None:
        try:
            self._ray.get(self.actor.close.remote())
        except Exception:
            pass
        self._kill_quietly()


class _ActorShell:
    """An actor's class: builds its worker with the builder and passes each call on to it."""

    def __init__(self, build: Callable[..., Any], args: tuple):
        self.worker = build(*args)

    def ping(self) -> None:
        """Answered once the worker is built: the actor is up."""

    def state_dict(self) -> Any:
        return self.worker.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.worker.load_state_dict(state)

    def close(self) -> None:
        self.worker.close()


class _RolloutShell(_ActorShell):
    def sample(self, problems: list[Problem]) -> list[Group]:
        return self.worker.sample(problems)

    def set_weights(self, weights: dict, version: int) -> float:
        return self.worker.set_weights(weights, version)

    def reseed(self, salt: int) -> None:
        self.worker.reseed(salt)

    def sampler_record(self) -> dict[str, float]:
        return self.worker.sampler_record()


class _RewardShell(_ActorShell):
    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        return self.worker.score(groups)

    def last_error(self) -> Optional[tuple[str, str]]:
        return self.worker.last_error()

    def probe(self, group: Group) -> Optional[tuple[str, str]]:
        return self.worker.probe(group)


class RayRollout(RayHandle):
    """A rollout worker as a Ray actor."""

    shell = _RolloutShell

    def sample(self, problems: list[Problem]) -> list[Group]:
        return self._get(lambda actor: actor.sample.remote(problems))

    def set_weights(self, weights: dict, version: int) -> float:
        return self._get(lambda actor: actor.set_weights.remote(weights, version))

    def reseed(self, salt: int) -> None:
        self._get(lambda actor: actor.reseed.remote(salt))

    def sampler_record(self) -> dict[str, float]:
        return self._get(lambda actor: actor.sampler_record.remote())


class RayReward(RayHandle):
    """A reward worker as a Ray actor."""

    shell = _RewardShell

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        return self._get(lambda actor: actor.score.remote(groups))

    def last_error(self) -> Optional[tuple[str, str]]:
        return self._get(lambda actor: actor.last_error.remote())

    def probe(self, group: Group) -> Optional[tuple[str, str]]:
        return self._get(lambda actor: actor.probe.remote(group))


class WorkerPool:
    """Several handles of one kind of worker, called like one (the subclasses say how): a list
    of problems or groups is cut into contiguous shares, one per worker, called at once; state
    is a list, one entry per worker."""

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

    def _each(self, call: Callable[..., Any], args_per_worker: list[tuple]) -> list[Any]:
        """``call(handle, *args)`` for every handle with its own arguments, at once; the answers in order."""
        futures = [self._threads.submit(call, h, *args) for h, args in zip(self.handles, args_per_worker)]
        return [f.result() for f in futures]

    def _shared(self, call: Callable[..., Any], items: list) -> list[Any]:
        """``call(handle, share)`` with each handle's contiguous share of ``items``."""
        return self._each(call, [(items[s],) for s in _shares(len(items), len(self.handles))])

    def _all(self, call: Callable[..., Any]) -> list[Any]:
        return self._each(call, [()] * len(self.handles))

    def state_dict(self) -> list:
        return self._all(lambda handle: handle.state_dict())

    def load_state_dict(self, state: list) -> None:
        self._each(lambda handle, own: handle.load_state_dict(own), [(own,) for own in state])

    def close(self) -> None:
        for handle in self.handles:
            handle.close()
        self._threads.shutdown()


class RolloutPool(WorkerPool):
    """Rollout workers sharing a round: their groups joined in order; weights go to every
    worker, and setting them takes as long as the slowest."""

    def sample(self, problems: list[Problem]) -> list[Group]:
        answers = self._shared(lambda handle, share: handle.sample(share), problems)
        return [group for groups in answers for group in groups]

    def set_weights(self, weights: dict, version: int) -> float:
        return max(self._all(lambda handle: handle.set_weights(weights, version)))

    def reseed(self, salt: int) -> None:
        self._all(lambda handle: handle.reseed(salt))

    def sampler_record(self) -> dict[str, float]:
        """Each worker's record, its keys under ``rollout_worker/<i>/`` (each has its own sampler)."""
        records = self._all(lambda handle: handle.sampler_record())
        return {f"rollout_worker/{i}/{key}": value for i, record in enumerate(records) for key, value in record.items()}


class RewardPool(WorkerPool):
    """Reward workers sharing a round: the scored groups joined in order, their records merged
    (:func:`merge_records`); the last error is the first worker's that has one."""

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        answers = self._shared(lambda handle, share: handle.score(share), groups)
        return [g for scored, _ in answers for g in scored], merge_records(answers)

    def last_error(self) -> Optional[tuple[str, str]]:
        return next((error for error in self._all(lambda handle: handle.last_error()) if error is not None), None)

    def probe(self, group: Group) -> Optional[tuple[str, str]]:
        """Asked of the first worker: every worker holds the same graders."""
        return self.handles[0].probe(group)


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


def start_ray(address: Optional[str]) -> None:
    """Connect to the Ray cluster at ``address``, or start a private local one here (None), unless
    this process is connected already; a ConfigError when Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise ConfigError("pipeline.backend=ray needs Ray: pip install 'tempering[ray]'") from None
    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster, started here
        ray.init(address=address, include_dashboard=False, log_to_driver=False, namespace="tempering",
                 ignore_reinit_error=True)


def ray_running() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()


def rollout_pool(handles: list[RayRollout]) -> RolloutHandle:
    """One handle as it is; several as a :class:`RolloutPool` sharing each round."""
    return handles[0] if len(handles) == 1 else RolloutPool(handles)


def reward_pool(handles: list[RayReward]) -> RewardHandle:
    """One handle as it is; several as a :class:`RewardPool` sharing each round."""
    return handles[0] if len(handles) == 1 else RewardPool(handles)


def actor_placement(config: TrainConfig) -> Iterator[Any]:
    """``(placement group, bundle index)`` for each actor in turn (rollout actors first), or
    None each time without ``pipeline.placement``; the group is ready (its resources reserved)
    before any actor starts, or a ConfigError says which resources the cluster lacks."""
    pc = config.pipeline
    if pc.placement == "none":
        return itertools.repeat(None)
    import ray
    from ray.util.placement_group import placement_group

    if pc.rollout_cpus + pc.rollout_gpus == 0 or pc.reward_cpus == 0:
        raise ConfigError(f"pipeline.placement={pc.placement} reserves each actor's resources: set "
                          "pipeline.rollout_cpus (or rollout_gpus) and pipeline.reward_cpus above 0")
    rollout = {"CPU": pc.rollout_cpus, **({"GPU": pc.rollout_gpus} if pc.rollout_gpus else {})}
    bundles = [rollout] * pc.rollout_workers + [{"CPU": pc.reward_cpus}] * pc.reward_workers
    group = placement_group(bundles, strategy=pc.placement.upper())
    if not group.wait(timeout_seconds=120):
        ray.util.remove_placement_group(group)
        raise ConfigError(f"pipeline.placement: the Ray cluster cannot hold {bundles} "
                          f"({ray.cluster_resources()} in all); lower the actors' resources or add nodes")
    return iter([(group, i) for i in range(len(bundles))])
