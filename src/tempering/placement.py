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
CPUs and GPUs before any starts (:func:`actor_placement`), and custom resources
(:class:`ActorResources`) put each kind of actor on the nodes started to offer them.

The learner can run on Ray too (:class:`RayLearner`): its data-parallel ranks as actors, called
by the training loop as it calls a learner in this process, with a copy of the policy kept here.
An actor that is gone for good (its node stopped, no other node offering its resources) is a
``WorkerLost``: the run stops, to be resumed from its last checkpoint.

Not here: which worker is built from the config (``tempering.build``), and what a round is
(``tempering.pipeline``).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol, runtime_checkable

from tempering.config import ConfigError, TrainConfig
from tempering.faults import WorkerLost
from tempering.types import Batch, Group, Problem


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


@dataclass
class ActorResources:
    """The custom Ray resources an actor asks for (``custom``, e.g. ``{"rollout": 1}``, so that it
    lands on a node started with ``ray start --resources '{"rollout": 1}'``), the config field
    that set them, and how long it may take to be placed and built (``start_s``)."""

    custom: dict[str, float] = field(default_factory=dict)
    field_name: str = ""
    start_s: float = 300.0

    def check_offered(self) -> None:
        """A ConfigError when no node of the cluster offers as much of a custom resource as one
        actor asks for (none ever will: Ray would leave the actor pending for good)."""
        import ray

        if not self.custom:
            return
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        if not any(all(offer.get(key, 0) >= amount for key, amount in self.custom.items()) for offer in nodes):
            amounts = {key: int(value) if float(value).is_integer() else value for key, value in self.custom.items()}
            offers = "; ".join(_shown(_custom(offer)) for offer in nodes) or "none"
            raise ConfigError(f"{self.field_name}={_shown(amounts)}: no live node of the Ray cluster offers that much "
                              f"(the live nodes' custom resources: {offers}); start a "
                              f"node with `ray start --address HEAD:PORT --resources '{json.dumps(amounts)}'`, or "
                              f"change {self.field_name}")

    def wait_started(self, refs: list[Any], name: str) -> list[Any]:
        """The answers of ``refs`` (calls on actors just created), or a ConfigError when they take
        longer than ``start_s`` (no room on a node that offers the resources); an error the
        builder raised in the actor is raised here (a ConfigError as itself, without Ray's trace)."""
        import ray

        try:
            return ray.get(refs, timeout=self.start_s)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(f"Ray actor {name} was not running after {self.start_s:g} s (pipeline.actor_start_s): "
                              f"no node has room for it ({self.field_name}={_shown(self.custom)}, "
                              f"{ray.available_resources()} free now)") from None
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, ConfigError):
                raise exc.cause from None
            raise


def _custom(offer: dict[str, float]) -> dict[str, float]:
    """A node's resources without Ray's own (CPU, GPU, memory, node:... labels)."""
    own = {"CPU", "GPU", "memory", "object_store_memory"}
    return {key: value for key, value in offer.items()
            if key not in own and not key.startswith(("node:", "accelerator"))}


def _shown(amounts: dict[str, float]) -> str:
    """``{learner: 1}``: resources as a config override writes them."""
    return "{" + ", ".join(f"{key}: {value:g}" for key, value in amounts.items()) + "}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


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
                 num_gpus: float = 0.0, placement: Any = None, resources: Optional[ActorResources] = None):
        import ray

        self._ray = ray
        self.build, self.args, self.name = build, args, name
        self.restart_limit, self.num_cpus, self.on_restart = restart_limit, num_cpus, on_restart
        self.num_gpus, self.placement = num_gpus, placement
        self.resources = resources or ActorResources()
        self.restarts = 0
        self.actor = self._start()

    def _start(self):
        name = self.name if not self.restarts else f"{self.name}-restart{self.restarts}"
        options: dict[str, Any] = {}
        if self.placement is not None:  # (group, bundle): a restarted actor takes the same bundle
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            group, bundle = self.placement
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, bundle)
        self.resources.check_offered()
        remote = self._ray.remote(self.shell).options(name=name, num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                                       resources=self.resources.custom, max_concurrency=1,
                                                       lifetime=None, **options)
        actor = remote.remote(self.build, self.args)
        self.node = self.resources.wait_started([actor.ping.remote()], name)[0]
        return actor

    def _get(self, call: Callable[[Any], Any]) -> Any:
        """The answer of ``call(actor)`` (a Ray object reference), a dead actor restarted and
        asked again, up to ``restart_limit`` times; one that cannot be started again (its node
        gone, no other offering its resources) is a :class:`WorkerLost`."""
        while True:
            try:
                return self._ray.get(call(self.actor))
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.ActorUnavailableError) as exc:
                if self.restarts >= self.restart_limit:
                    raise WorkerLost(f"Ray actor {self.name} died {self.restarts + 1} times "
                                     f"(pipeline.restart_limit={self.restart_limit}): {_first_line(exc)}") from None
                self.restarts += 1
                self._kill_quietly()
                try:
                    self.actor = self._start()
                except ConfigError as lost:
                    raise WorkerLost(f"Ray actor {self.name} died ({_first_line(exc)}) and cannot be started "
                                     f"again: {lost}") from None
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

    def ping(self) -> str:
        """Answered once the worker is built (the actor is up): the id of its Ray node."""
        import ray

        return ray.get_runtime_context().get_node_id()

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


class _LearnerShell:
    """One learner rank's actor. Built in two calls, so that the ranks can meet: rank 0 names
    an address first (:meth:`address`), then every rank builds its learner at once
    (:meth:`build`: with several, ``torch.distributed`` joins them there). Rank 0 answers
    the driver (:meth:`call`); the others follow it (:meth:`follow`)."""

    def ping(self) -> None:
        """Answered once the actor's process is up."""

    def address(self) -> tuple[str, int]:
        """This node's address and a port free on it, for the ranks' process group."""
        import ray

        with socket.socket() as probe:
            probe.bind(("", 0))
            return ray.util.get_node_ip_address(), probe.getsockname()[1]

    def build(self, build: Callable[..., Any], args: tuple, rank: int, world: int,
              address: Optional[tuple[str, int]]) -> str:
        """Build this rank's learner with ``build(*args)``; return the id of the node it runs on."""
        import ray

        if world > 1:  # what torchrun would set: tempering.learner.parallel reads it
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR=address[0],
                              MASTER_PORT=str(address[1]))
        self.learner = build(*args)
        return ray.get_runtime_context().get_node_id()

    def follow(self, follow: Callable[[Any], None]) -> None:
        """A follower's whole life, ``follow(learner)``: the learner methods rank 0 names, until it says stop."""
        follow(self.learner)

    def call(self, method: str, *args: Any) -> tuple[Any, int]:
        """``learner.<method>(*args)`` and the learner's policy version after it."""
        return getattr(self.learner, method)(*args), self.learner.version

    def weights(self) -> dict[str, Any]:
        """The policy's whole weights, on the CPU (under fsdp: rank 0's gathered copy)."""
        policy = self.learner.whole if self.learner.whole is not None else self.learner.model
        return {key: tensor.detach().cpu() for key, tensor in policy.state_dict().items()}


class RayLearner:
    """The learner as Ray actors (``pipeline.learner=ray``), called by the training loop as it
    calls a ``tempering.learner.step.Learner`` in this process.

    ``world`` actors are the data-parallel ranks of one learner: rank 0 takes the driver's
    calls and tells the others what to do, as under torchrun (``tempering.learner.parallel``).
    The driver keeps ``mirror``, its own copy of the policy, which it samples with (or sends to
    its rollout workers), evaluates and checkpoints: after every step the actors' new weights
    are copied into it, and loading a state (a resume, a rollback) first sends the mirror's
    weights, just loaded from the checkpoint, to the actors. So checkpoints are written by the
    driver, into the run folder, as for a learner in this process.

    Not done: restarting a learner actor that died. Its optimizer state lived only there, so a
    lost learner (its node stopped) is a :class:`WorkerLost`, and the run continues from its
    last checkpoint with ``temper train --resume``.
    """

    parallel = None  # the ranks coordinate among themselves, not with this process

    def __init__(self, build: Callable[..., Any], args: tuple, mirror: Any, name: str, world: int = 1,
                 num_cpus: float = 0.0, num_gpus: float = 0.0, resources: Optional[ActorResources] = None,
                 follow: Optional[Callable[[Any], None]] = None):
        import ray

        self._ray, self.mirror, self.name = ray, mirror, name
        resources = resources or ActorResources()
        resources.check_offered()
        remote = ray.remote(_LearnerShell)
        self.actors = [remote.options(name=f"{name}-{rank}", num_cpus=num_cpus, num_gpus=num_gpus,
                                      resources=resources.custom, max_concurrency=1).remote()
                       for rank in range(world)]
        try:
            resources.wait_started([actor.ping.remote() for actor in self.actors], name)
            address = ray.get(self.actors[0].address.remote()) if world > 1 else None
            self.nodes = resources.wait_started([actor.build.remote(build, args, rank, world, address)
                                                 for rank, actor in enumerate(self.actors)], name)
        except BaseException:
            self.close()
            raise
        self._following = [actor.follow.remote(follow) for actor in self.actors[1:]]
        self.version = 0
        self._call("load_weights", mirror.state_dict())  # the driver's policy is the one trained

    def _call(self, method: str, *args: Any) -> Any:
        answer, self.version = self._get(self.actors[0].call.remote(method, *args))
        return answer

    def _get(self, ref: Any) -> Any:
        """The answer of a call on rank 0; a follower that stopped following meanwhile (its
        error, or its actor gone) is raised here, not left to hang rank 0 in a collective."""
        try:
            ready, _ = self._ray.wait([ref, *self._following], num_returns=1)
            if ready[0] is not ref:
                self._ray.get(ready[0])
                raise WorkerLost(f"a rank of the learner's Ray actors {self.name} stopped following rank 0")
            return self._ray.get(ref)
        except (self._ray.exceptions.RayActorError, self._ray.exceptions.ActorUnavailableError) as exc:
            raise WorkerLost(f"the learner's Ray actor {self.name} is gone: {_first_line(exc)}") from None

    def step(self, batch: Batch) -> dict[str, float]:
        """One learner step on the actors; the mirror then holds the new weights."""
        record = self._call("step", batch)
        self.mirror.load_state_dict(self._get(self.actors[0].weights.remote()))
        return record

    def values(self, batch: Batch) -> Any:
        return self._call("values", batch)

    def reward_penalty(self, batch: Batch) -> Any:
        return self._call("reward_penalty", batch)

    def teacher_logprobs(self, batch: Batch) -> Any:
        return self._call("teacher_logprobs", batch)

    def grad_shares(self, batch: Batch, domains_B: list[str]) -> dict[str, float]:
        return self._call("grad_shares", batch, list(domains_B))

    def state_dict(self) -> dict[str, Any]:
        return self._call("state_dict")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The learner's state, with the mirror's weights (loaded from the same checkpoint)."""
        self._call("load_weights", self.mirror.state_dict())
        self._call("load_state_dict", state)

    def close(self) -> None:
        for actor in self.actors:
            try:
                self._ray.kill(actor)
            except Exception:  # already gone
                pass


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
        raise ConfigError("pipeline.backend=ray and pipeline.learner=ray need Ray: "
                          "pip install 'tempering[ray]'") from None
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


def actor_nodes(handle: Any) -> list[str]:
    """The Ray node ids a handle's actors run on, one per actor (none for a worker in this process)."""
    if isinstance(handle, WorkerPool):
        return [node for each in handle.handles for node in actor_nodes(each)]
    return [handle.node] if isinstance(handle, RayHandle) else []


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
