"""Where rollouts come from: the workers, and the synchronous or asynchronous loop of rounds.

Two workers with small interfaces do the work between the scheduler and the learner:

- :class:`RolloutWorker` samples groups for problems (``sample``) with any
  :class:`~tempering.rollout.base.Generator` (a Hugging Face model in this process, or
  another sampler that keeps the protocol), takes new weights by version
  (``set_weights``), and owns its RNG;
- :class:`RewardWorker` scores groups in place (``score``) and owns the reward
  normalizer's statistics.

They are plain classes; a *handle* places one, in this process (the worker itself) or as a
Ray actor, typed by ``tempering.placement``'s protocols.

:class:`Pipeline` turns them into *rounds*: ``prompts`` problems drawn from the scheduler,
sampled and scored; the learner asks for them one at a time (``next_round``), each with what
it cost, and as it takes one the scheduler observes it (the groups, and the seconds sampling
them took, for its cost model) and the counters count it. In ``sync`` mode a round is made
when the learner asks for it, with the learner's current weights (staleness 0). In ``async``
mode a feeder thread keeps up to ``buffer_rounds`` rounds ready while the learner trains; new
weights reach the rollout worker between rounds, so a round can be older than the learner
by a few versions. Which weights and problems each round gets is decided by the learner's
steps, not by when the feeder gets to them (``tempering.versions``' :class:`Timeline`), so an
async run repeats itself and resumes bit for bit like a synchronous one. Staleness is
decided per rollout, not per round: every rollout carries the version that sampled it, and
when the learner takes a round, each rollout more than ``max_staleness`` versions behind it
is dropped and counted (``dropped_stale``), the others trained, the stale among them with
the learner's off-policy correction (which weighs each row by its own sampler's log-probs;
see ``tempering.versions``' ``fresh_groups`` for a group only partly too stale, and
``staleness_record`` for what each step logs).

With ``partial_rollouts`` (async, the built-in sampler in this process or a server) new
weights do not wait for the round to end: the sampler takes them once per round, after
``partial_chunk`` decoding steps (:meth:`RolloutWorker.follow`), computes what it has drawn
so far again with them (the built-in sampler its cache, ``tempering.rollout.hf``; a server,
reloaded between the chunks of its requests, the prefix of each continued request,
``tempering.rollout.requests``) and goes on. A rollout then holds tokens of several versions, each
with its own version (``Rollout.versions``) and its own log-prob under the weights that drew
it, which is what the learner's correction divides by, token by token. Its
``policy_version``, and so everything decided per rollout (``max_staleness``, the
``staleness/*`` record, whether the learner corrects its batch), is its oldest token's: a
rollout is never kept with a token more than ``max_staleness`` versions behind, whatever its
newer tokens. What partial rollouts change is how fresh the tokens are
(``staleness/token_mean``) and that no update waits for a long round to end; they do not make
a round of old tokens fresh.

A round whose every rollout the rewards dropped (a grader that is down: a sandbox service,
a remote reward model) is an *outage*: counted (``outage_rounds``), and after a wait of
``outage_backoff_s`` (doubling with each further outage in a row, at most
``MAX_OUTAGE_WAIT_S``) the same problems are sampled again. After ``max_outage_rounds``
outages in a row the pipeline raises :class:`GraderOutage` naming the reward and its last
error; the problems of that round are kept in the state, so a run resumed from a checkpoint
taken then samples them first.

A *partial* outage is one domain's grader down while the others score: a task (a domain of
the mixture) whose every rollout of a round the rewards dropped, in a round where another
task scored or where other tasks are left to draw from. With ``pause_failing`` the pipeline
pauses it (:meth:`~tempering.scheduler.Mixture.pause`): no more draws of it, the round's
other groups trained as usual (a round that drew only it is drawn again from the others, at
once). Its dropped rollouts are neither trained on nor scored as wrong, only counted. One of
them is held, and at the start of the round ``probe_rounds`` after the pause the task's
graders are asked to score it again (:meth:`~tempering.rewards.compose.Rewarder.probe`): the
task is re-admitted when they do, and probed again ``probe_rounds`` x 2 ** (failed probes)
rounds later (at most ``max_probe_rounds``) when they do not. A probe re-scores a real rollout
rather than asking a health endpoint: every reward can be probed that way (a plug-in, a
remote verifier, a reward model, the sandbox service), and what answers is what training
needs, not a ``/health`` that answers while runs fail. A grader that fails for every task
left to draw from is the whole-run outage above.

Per task the pipeline keeps what became of each rollout it sampled (:meth:`Pipeline.domain_counts`):
trained, dropped (a grader's error, too stale, or taken by a step that did not train on it:
dynamic sampling, the token cap; :meth:`Pipeline.settle`) or still buffered, so that sampled
= trained + dropped + buffered for every task.

State: ``state_dict`` holds the buffered rounds (sampled and scored, not yet trained on),
the problems of a round an outage stopped, the rollouts held to probe paused tasks, the
rollout worker's RNG, the reward normalizer and the counters; in async mode it is
taken with the feeder paused between rounds, so nothing is in flight, and holds the
:class:`Timeline` (problems drawn for rounds not yet made, the learner's asks, weights a
later round may still start from).

Several workers of a kind share a round through a worker pool (``tempering.placement``).
An OpenAI-compatible inference server is a generator (``tempering.rollout.remote``)
inside the rollout worker.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from tempering import faults
from tempering.rollout.base import Generator, SamplingParams, ServerError
from tempering.types import Group, Problem, Round
from tempering.versions import Timeline, fresh_groups, tokens

if TYPE_CHECKING:  # placement reads the config, which the pipeline does not
    from tempering.placement import RewardHandle, RolloutHandle

LOG = logging.getLogger("tempering.pipeline")

MAX_OUTAGE_WAIT_S = 600.0
"""The longest wait between two sampling rounds of one outage, however many came before."""


class GraderOutage(RuntimeError):
    """Rounds in a row whose every rollout the rewards dropped, past the pipeline's budget."""

    def __init__(self, reward: str, error: str, rounds: int):
        super().__init__(reward, error, rounds)
        self.reward, self.error, self.rounds = reward, error, rounds

    def __str__(self) -> str:
        return (f"reward {self.reward!r} dropped every rollout of {self.rounds} sampling rounds in a row; "
                f"its last error: {self.error}")


class RolloutWorker:
    """Samples groups with a :class:`~tempering.rollout.base.Generator` and owns its random stream.
    In this process it is its own :class:`~tempering.placement.RolloutHandle`."""

    restarts = 0
    """A worker in this process is never restarted."""

    def __init__(self, generator: Generator, sampling: SamplingParams, group_size: int, seed: int):
        self.generator = generator
        self.sampling, self.group_size = sampling, group_size
        self.rng = torch.Generator().manual_seed(seed)
        self.version = 0

    def sample(self, problems: list[Problem]) -> list[Group]:
        faults.point("sample")
        return self.generator.generate(problems, self.group_size, self.sampling, self.version, self.rng)

    def follow(self, take: Callable[[int], Optional[tuple[dict, int]]], chunk: int) -> None:
        """Take new weights from ``take`` (told the decoding steps done since it was last
        asked; ``(weights, version)``, or None when none are due) between the generator's
        decoding steps too, not only between rounds (partial rollouts; the generator must ask
        ``updates``: the built-in sampler after every step, a request sampler after its first
        ``chunk`` tokens)."""
        def update(steps: int = 1) -> Optional[int]:
            pending = take(steps)
            if pending is None:
                return None
            self.set_weights(*pending)
            return pending[1]
        self.generator.updates = update
        self.generator.partial_chunk = chunk

    def sampler_record(self) -> dict[str, float]:
        """What the generator reports about its engines (the servers' state, versions and
        failovers: ``tempering.rollout.remote``); empty for one that reports nothing."""
        return self.generator.record() if hasattr(self.generator, "record") else {}

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
    """Scores groups in place with the tasks' rewards; in this process its own
    :class:`~tempering.placement.RewardHandle`."""

    restarts = 0

    def __init__(self, rewarder: Any):
        self.rewarder = rewarder

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        record = self.rewarder.score(groups)
        return groups, record

    def last_error(self) -> Optional[tuple[str, str]]:
        """``(reward, error)`` of the newest rollout a reward dropped, None before any."""
        return self.rewarder.last_error

    def probe(self, group: Group) -> Optional[tuple[str, str]]:
        """``(reward, error)`` when a grader of the group's task still fails on it, else None."""
        return self.rewarder.probe(group)

    def state_dict(self) -> dict:
        return self.rewarder.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.rewarder.load_state_dict(state)

    def close(self) -> None:
        self.rewarder.close()


@dataclass
class DomainCounts:
    """What became of one task's sampled rollouts: sampled = trained + dropped + buffered."""

    sampled: int = 0
    trained: int = 0
    dropped: int = 0
    """A grader's error (a paused task's rollouts, outage rounds), too stale, or not trained by
    the step that took it (dynamic sampling, the token cap)."""


@dataclass
class Counters:
    rounds: int = 0
    rollouts_sampled: int = 0
    rollouts_taken: int = 0
    dropped_stale: int = 0
    dropped_stale_tokens: int = 0
    """Completion tokens of the rollouts dropped as too stale: sampling thrown away."""
    weight_syncs: int = 0
    outage_rounds: int = 0
    domains: dict[str, DomainCounts] = field(default_factory=dict)
    """Per task name."""

    def domain(self, name: str) -> DomainCounts:
        return self.domains.setdefault(name, DomainCounts())


class Pipeline:
    """Scored rounds for the learner, made on demand (sync) or ahead by a feeder thread (async)."""

    def __init__(self, mixture: Any, rollout: RolloutHandle, reward: RewardHandle, prompts: int, mode: str = "sync",
                 max_staleness: int = 1, buffer_rounds: int = 1, shares_policy: bool = False,
                 max_outage_rounds: int = 0, outage_backoff_s: float = 0.0, pause_failing: bool = True,
                 probe_rounds: int = 1, max_probe_rounds: int = 32, partial_rollouts: bool = False,
                 partial_chunk: int = 16):
        if mode not in ("sync", "async"):
            raise ValueError(f"pipeline mode {mode!r}; known: sync, async")
        self.mixture, self.rollout, self.reward = mixture, rollout, reward
        self.prompts, self.mode = prompts, mode
        self.max_staleness, self.buffer_rounds = max_staleness, buffer_rounds
        self.shares_policy = shares_policy
        self.max_outage_rounds, self.outage_backoff_s = max_outage_rounds, outage_backoff_s
        self._outage_problems: Optional[list[Problem]] = None
        self.pause_failing, self.probe_rounds, self.max_probe_rounds = pause_failing, probe_rounds, max_probe_rounds
        self._held: dict[str, Group] = {}  # per paused task, a rollout its grader dropped: what probes score
        self._unsettled: list[Group] = []  # taken by the learner's step, not yet settled
        self.counters = Counters()
        self.learner_version = 0
        self._buffer: deque[Round] = deque()
        self._timeline = Timeline(buffer_rounds, partial_chunk)  # async: what each round gets
        self._cond = threading.Condition()
        self._paused = False
        self._busy = False
        self._stop = False
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        self._last_weights: Optional[tuple[dict, int]] = None
        if hasattr(rollout, "on_restart"):
            rollout.on_restart = self._refresh_rollout
        if partial_rollouts and mode == "async":
            rollout.follow(self._swap, partial_chunk)

    def _refresh_rollout(self, handle: RolloutHandle) -> None:
        """A restarted rollout worker: the newest weights, and a random stream of its own."""
        if self._last_weights is not None:
            handle.set_weights(*self._last_weights)
        handle.reseed(handle.restarts)

    # -- making rounds -------------------------------------------------------------------
    def _loading(self, taken: Optional[tuple[dict, int]]) -> Optional[tuple[dict, int]]:
        """With the lock held: weights the rollout worker is about to load, counted as a sync."""
        if taken is not None:
            self._last_weights = taken
            self.counters.weight_syncs += 1
        return taken

    def _start_weights(self, index: int) -> tuple[float, int]:
        """Async: load the weights round ``index`` starts with (``tempering.versions``); return
        the seconds it took and their version."""
        with self._cond:
            taken, version = self._timeline.start(index)
            self._loading(taken)
        return (0.0 if taken is None else self.rollout.set_weights(*taken)), version

    def _swap(self, steps: int) -> Optional[tuple[dict, int]]:
        """Partial rollouts: asked by the sampler after ``steps`` more decoding steps; at the
        end of the round's chunk, waits for the learner to decide and returns the weights to
        take there (``tempering.versions``), else None."""
        with self._cond:
            if not self._timeline.at_chunk_end(steps):
                return None
            self._cond.wait_for(lambda: self._stop or self._timeline.decided(self.learner_version))
            taken = None if self._stop else self._loading(self._timeline.swap(self.learner_version))
        if taken is not None:
            faults.point("swap")
        return taken

    def _make_round(self) -> Round:
        faults.point("round")
        index = self.counters.rounds
        sync_s, version = self._start_weights(index) if self.mode == "async" else (0.0, None)
        self._probe_paused()
        with self._cond:
            problems, self._outage_problems = self._outage_problems, None
            if problems is None:
                problems = (self._timeline.plans.popleft() if self.mode == "async"
                            else self.mixture.next_problems(self.prompts))
        tally: dict = {"sampled": {}, "dropped": {}, "outage_rounds": 0}
        groups, record, generate_s, reward_s = self._sample_and_score(problems, tally)
        if version is None:
            version = groups[0].rollouts[0].policy_version if groups and groups[0].rollouts else self.learner_version
        tally["rollouts"] = sum(len(g.rollouts) for g in groups)
        self.counters.rounds += 1
        return Round(groups, record, version, generate_s, reward_s, sync_s, sampler=self.rollout.sampler_record(),
                     tally=tally)

    def _count(self, made: Round) -> bool:
        """Add a round's tally to the counters, once; False when it was added before."""
        tally, made.tally = made.tally, None
        if tally is None:
            return False
        with self._cond:
            self.counters.rollouts_sampled += tally["rollouts"]
            self.counters.outage_rounds += tally["outage_rounds"]
            for name, count in tally["sampled"].items():
                counts = self.counters.domain(name)
                counts.sampled += count
                counts.dropped += tally["dropped"][name]
        return True

    def _sample_and_score(self, problems: list[Problem], tally: dict
                          ) -> tuple[list[Group], dict[str, float], float, float]:
        """Scored groups of ``problems``, their reward record and the seconds spent sampling and
        scoring; an outage round is waited out and sampled again (see the module docstring).
        What it sampled and dropped is counted in ``tally``."""
        generate_s = reward_s = 0.0
        outages = 0
        while True:
            t0 = time.perf_counter()
            groups = self.rollout.sample(problems)
            sampled = [Group(g.problem, list(g.rollouts)) for g in groups]  # scoring drops failed rollouts
            t1 = time.perf_counter()
            groups, record = self.reward.score(groups)
            generate_s, reward_s = generate_s + t1 - t0, reward_s + time.perf_counter() - t1
            failing = self._count_scored(sampled, groups, tally)
            if groups or not record.get("reward/dropped"):
                self._pause(failing, sampled)
                return groups, record, generate_s, reward_s
            if self._pause(failing, sampled):  # a round of paused tasks only: draw from the others
                with self._cond:
                    problems = self.mixture.next_problems(self.prompts)
                continue
            reward, error = self.reward.last_error()  # set: something was dropped
            outages += 1
            if outages > self.max_outage_rounds:
                with self._cond:
                    self._outage_problems = problems
                raise GraderOutage(reward, error, outages)
            tally["outage_rounds"] += 1
            wait = min(self.outage_backoff_s * 2 ** (outages - 1), MAX_OUTAGE_WAIT_S)
            LOG.warning("reward outage: %s dropped every rollout of the round (%s); sampling it again in %.1f s "
                        "(%d of at most %d in a row)", reward, error, wait, outages, self.max_outage_rounds)
            time.sleep(wait)

    # -- partial outages (see the module docstring) ----------------------------------------
    def _count_scored(self, sampled: list[Group], scored: list[Group], tally: dict) -> list[str]:
        """Count a round's sampled and grader-dropped rollouts per task in ``tally``; return the
        tasks (in order of first draw) of which no rollout was scored."""
        kept: dict[str, int] = {}
        for group in scored:
            kept[group.problem.task] = kept.get(group.problem.task, 0) + len(group.rollouts)
        drawn: dict[str, int] = {}
        for group in sampled:
            drawn[group.problem.task] = drawn.get(group.problem.task, 0) + len(group.rollouts)
        for name, count in drawn.items():
            tally["sampled"][name] = tally["sampled"].get(name, 0) + count
            tally["dropped"][name] = tally["dropped"].get(name, 0) + count - kept.get(name, 0)
        return [name for name, count in drawn.items() if count and not kept.get(name)]

    def _pause(self, failing: list[str], sampled: list[Group]) -> bool:
        """Pause the ``failing`` tasks not yet paused (a round drawn before a pause may hold a
        paused one), holding one dropped rollout of each to probe. True when all of them are
        paused now; False, pausing none, when that would leave no task to draw from (a
        whole-run outage), when none failed, or when ``pause_failing`` is off."""
        if not self.pause_failing or not failing:
            return False
        last = self.reward.last_error()
        with self._cond:
            new = [name for name in failing if name not in self.mixture.paused]
            if set(self.mixture.drawable()) <= set(new):
                return False
            now = self.counters.rounds
            for name in new:
                group = next(g for g in sampled if g.problem.task == name)
                self._held[name] = Group(group.problem, group.rollouts[:1])
                self.mixture.pause(name, now, now + self.probe_rounds)
                LOG.warning("task %s paused: its grader dropped every rollout of round %d (last error: %s: %s); "
                            "the other tasks go on, and it is probed in %d rounds", name, now + 1,
                            *(last or ("?", "?")), self.probe_rounds)
            return True

    def _probe_paused(self) -> None:
        """Score again the held rollout of each paused task whose probe is due: re-admit the
        task when its graders answer, else back off (see the module docstring)."""
        with self._cond:
            now = self.counters.rounds
            due = self.mixture.due_probes(now)
        for name in due:
            failed = self.reward.probe(self._held[name])
            with self._cond:
                pause = self.mixture.paused[name]
                if failed is None:
                    self.mixture.readmit(name)
                    del self._held[name]
                    LOG.warning("task %s re-admitted: its grader answers again (paused for %d rounds)",
                                name, now - pause.since)
                    continue
                wait = min(self.probe_rounds * 2 ** (pause.probes + 1), self.max_probe_rounds)
                self.mixture.probe_failed(name, now + wait)
                LOG.info("task %s stays paused: %s: %s; probed again in %d rounds", name, *failed, wait)

    def settle(self, trained: list[Group]) -> None:
        """Close the step: of the groups taken since the last call, those in ``trained`` were
        trained on, the others dropped (per task, in :meth:`domain_counts`)."""
        kept = {id(group) for group in trained}
        with self._cond:
            for group in self._unsettled:
                counts = self.counters.domain(group.problem.task)
                if id(group) in kept:
                    counts.trained += len(group.rollouts)
                else:
                    counts.dropped += len(group.rollouts)
        self._unsettled = []

    def domain_counts(self) -> dict[str, dict[str, int]]:
        """Per task drawn so far: rollouts ``sampled``, ``trained``, ``dropped`` and ``buffered``
        (scored, waiting for the learner); after :meth:`settle`, sampled = trained + dropped +
        buffered."""
        with self._cond:
            buffered: dict[str, int] = {}
            for made in (r for r in self._buffer if r.tally is None):  # counted as sampled
                for group in made.groups:
                    buffered[group.problem.task] = buffered.get(group.problem.task, 0) + len(group.rollouts)
            return {name: {"sampled": c.sampled, "trained": c.trained, "dropped": c.dropped,
                           "buffered": buffered.get(name, 0)} for name, c in self.counters.domains.items()}

    def domain_record(self) -> dict[str, float]:
        """:meth:`domain_counts` as step-record keys ``domain/<task>/rollouts_<count>``."""
        return {f"domain/{name}/rollouts_{key}": value for name, counts in self.domain_counts().items()
                for key, value in counts.items()}

    def _feed(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stop or (
                        not self._paused and len(self._buffer) < self.buffer_rounds
                        and bool(self._timeline.plans or self._outage_problems)))
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
            with self._cond:
                self._timeline.plan(lambda: self.mixture.next_problems(self.prompts))
            self._thread = threading.Thread(target=self._feed, name="feeder", daemon=True)
            self._thread.start()

    def next_round(self) -> Round:
        """The next round with a rollout fresh enough to train on: made now (sync) or taken from
        the buffer (async). Each rollout's staleness is decided on its own
        (``fresh_groups``): those more than ``max_staleness`` versions behind the learner
        are dropped and counted, a round left with none is skipped; the one returned carries
        the largest ``staleness`` of the rollouts it keeps."""
        while True:
            if self.mode == "sync":
                made = self._buffer.popleft() if self._buffer else self._make_round()
            else:
                with self._cond:
                    self._timeline.ask(self.learner_version)
                    self._cond.notify_all()  # a sampler waiting to swap weights may wait for this ask
                    self._cond.wait_for(lambda: self._buffer or self._error is not None)
                    if isinstance(self._error, (GraderOutage, ServerError)):  # the user's to act on, as it is
                        raise self._error
                    if self._error is not None:
                        raise RuntimeError("the sampling thread failed") from self._error
                    made = self._buffer.popleft()
                    self._timeline.took()
                    self._timeline.plan(lambda: self.mixture.next_problems(self.prompts))
                    self._cond.notify_all()
            if self._count(made):  # the scheduler learns of a round when the learner takes it
                with self._cond:
                    self.mixture.observe(made.groups)
                    self.mixture.observe_sampling(made.generate_s)
            kept, stale = fresh_groups(made.groups, self.learner_version, self.max_staleness)
            with self._cond:
                self.counters.dropped_stale += sum(stale.values())
                self.counters.dropped_stale_tokens += tokens(made.groups) - tokens(kept)
                for task, count in stale.items():
                    self.counters.domain(task).dropped += count
            if stale and not kept:
                continue
            made.groups = kept
            made.staleness = max((self.learner_version - r.policy_version for g in kept for r in g.rollouts), default=0)
            self.counters.rollouts_taken += sum(len(g.rollouts) for g in kept)
            self._unsettled += kept
            return made

    def publish(self, model: Any, version: int) -> float:
        """New learner weights: the rollout worker gets them now (sync) or before its next round
        (async). Returns the seconds spent here."""
        start = time.perf_counter()
        if self.shares_policy:
            self.learner_version = version
            self.rollout.set_weights({}, version)  # same tensors: only the version moves
            return time.perf_counter() - start
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if self.mode == "sync":
            self.learner_version, self._last_weights = version, (weights, version)
            self.rollout.set_weights(weights, version)
            self.counters.weight_syncs += 1
        else:
            with self._cond:
                self.learner_version = version
                self._timeline.published[version] = weights
                self._cond.notify_all()
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
        return {"buffer": [copy.copy(r) for r in self._buffer], "rollout": self.rollout.state_dict(),
                "reward": self.reward.state_dict(), "counters": copy.deepcopy(self.counters),
                "outage_problems": self._outage_problems, "held": dict(self._held),
                "timeline": self._timeline.state_dict(self.counters.rounds, self.learner_version)}

    def load_state_dict(self, state: dict) -> None:
        self._buffer = deque(state["buffer"])
        self._outage_problems = state.get("outage_problems")
        self.rollout.load_state_dict(state["rollout"])
        self.reward.load_state_dict(state["reward"])
        self.counters = state["counters"]
        vars(self.counters).setdefault("domains", {})  # a checkpoint written before per-task counts
        vars(self.counters).setdefault("dropped_stale_tokens", 0)  # or before stale tokens were counted
        self._held = dict(state.get("held", {}))
        self._timeline.load_state_dict(state.get("timeline"), self.counters.rounds, len(self._buffer))

    def close(self) -> None:
        """Stop the feeder, then both workers: the reward worker (and the sandbox pool or model
        it holds) also when closing the rollout side raises, which is then raised."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        for made in self._buffer:  # left in the buffer: sampled, never taken
            self._count(made)
        try:
            self.rollout.close()
        finally:
            self.reward.close()
