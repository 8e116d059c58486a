"""Where workers run: in this process, or as Ray actors, alone or several of a kind.

The pipeline's workers (``tempering.pipeline``) are plain classes. A *handle* places one:
:class:`LocalHandle` calls it in this process; :class:`RayHandle` runs it as a Ray actor (a
named one, so operators and tests can find it), restarts it when it dies and re-issues the
call that was in flight, up to ``restart_limit`` times.

Several workers of a kind share a round through a :class:`WorkerPool`: problems (or groups)
are cut into contiguous shares, one per worker, called at once; weights go to every worker.
On Ray (joined or started by :func:`start_ray`), a placement group can reserve every actor's
CPUs and GPUs before any starts (:func:`actor_placement`).

Not here: which worker is built from the config (``tempering.build``), and what a round is
(``tempering.pipeline``).
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional

from tempering.config import ConfigError, TrainConfig
from tempering.types import Group


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
        if method == "last_error":
            return next((answer for answer in answers if answer is not None), None)
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


def pool(handles: list[RayHandle]) -> Any:
    """One handle as it is; several as a :class:`WorkerPool` sharing each round."""
    return handles[0] if len(handles) == 1 else WorkerPool(handles)


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
