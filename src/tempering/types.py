"""The data that moves through one RL step, and the shape letters used in names.

Shape letters (a tensor's name ends with its shape, e.g. ``logprobs_BT``; a digit is an axis
of that size, e.g. ``max_B1``). Each letter has this one meaning everywhere, and
``tests/unit/test_shape_letters.py`` fails on a name that uses a letter not listed here:

- ``B``: rows of a batch (one sequence each)
- ``T``: token positions along whatever rows a tensor holds (a row, a prompt, a completion)
- ``P``: distinct prompts
- ``G``: samples per prompt (a group)
- ``V``: vocabulary
- ``H``: hidden width (a model's)
- ``R``, ``W``: packed rows and their width (``tempering.learner.packing``)
- ``N``, ``C``: tokens taken out of their rows into one flat list, and a chunk of them
- ``U``: decoding histories (the distinct token sequences the sampler's cache holds)
- ``L``: cache slots opened in one decoding step
- ``E``: candidate tokens kept for top-p
- ``Z``, ``Y``: blocks of a vocabulary and the entries of one (the sampler's search for a
  drawn token)
- ``A``: query heads
- ``K``: key/value heads
- ``M``: query heads per key/value head
- ``D``: head width
- ``J``: pairs of a head's dimensions that rotary embeddings rotate together (``D / 2``)
- ``Q``, ``S``: query positions and key positions (attention scores)
- ``F``: features laid side by side (fused projections, a row's values compared when
  merging rows)
- ``O``, ``I``: output and input features of a linear layer (its weight is ``O x I``)

Token lists on a :class:`Rollout` are plain Python lists; tensors appear only once a
:class:`Batch` is formed for the learner.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional, Union

import torch

Messages = list[dict[str, str]]
Prompt = Union[str, Messages]


def domain_of(task: str, domain: str = "") -> str:
    """The domain a task's statistics are kept under: the one it names, else the task's own
    name (each task is its own domain unless told otherwise).

    >>> domain_of("add"), domain_of("add", "arithmetic")
    ('add', 'arithmetic')
    """
    return domain or task


@dataclass(frozen=True)
class Problem:
    """One question a task asks, with everything needed to grade it.

    ``prompt`` is raw text (fed to the model as is) or chat messages (rendered with the
    tokenizer's chat template). ``answer`` is the reference the task's rewards compare to.
    """

    task: str
    id: str
    prompt: Prompt
    answer: str
    domain: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """Identifier unique across tasks."""
        return f"{self.task}/{self.id}"

    @property
    def domain_key(self) -> str:
        """The domain the problem counts under (:func:`domain_of` its task and ``domain``)."""
        return domain_of(self.task, self.domain)


@dataclass
class RewardResult:
    """One rollout's score from one reward (``tempering.rewards``' result type, here so that
    every reward module can use it without importing the reward registry).

    ``components`` are named sub-scores (logged as ``reward/<reward>/<name>``);
    ``diagnostics`` are counts or labels for people (``{"extracted": "85"}``); ``error``
    names an infrastructure fault, in which case ``score`` means nothing.
    """

    score: float
    components: dict[str, float] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None


@dataclass
class Turn:
    """One model turn of a multi-turn episode and what the environment answered.

    ``start``/``end`` index the model's tokens in ``Rollout.completion_ids``; the
    environment's tokens (``observation_ids``) follow at ``end``, with loss weight 0."""

    text: str
    start: int
    end: int
    finish_reason: str
    observation: Any = None
    observation_ids: list[int] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)
    info: dict[str, float] = field(default_factory=dict)


@dataclass
class Rollout:
    """One sampled completion, exactly as the sampler produced it.

    ``logprobs`` holds the sampler's log-probability of each completion token under the
    temperature-scaled distribution (top-p truncation excluded), so the learner can form
    importance ratios against it. ``loss_mask`` marks the completion tokens that are trained
    on (1) or ignored (0). ``policy_version`` is the learner step whose weights sampled it:
    with partial rollouts (``tempering.pipeline``) new weights may take over while it is
    decoded, and it is then the version of its first token, the oldest, while ``versions``
    holds each token's own (and ``logprobs`` each token's under the weights that drew it).

    In a multi-turn episode the completion is every token after the first prompt, the model's
    turns and the environment's answers in order; the environment's tokens have log-prob 0
    and loss weight 0, and ``text`` is the last model turn (what the task's rewards grade).
    """

    problem: Problem
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    policy_version: int
    loss_mask: list[int] = field(default_factory=list)
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    turns: list["Turn"] = field(default_factory=list)
    """A multi-turn episode's turns in order (``tempering.envs``); empty for one completion."""
    reward_s: float = 0.0
    """Seconds its rewards took, its share of each reward's batch (set by the rewarder): the
    mixture's measure of what a domain's grading costs."""
    versions: list[int] = field(default_factory=list)
    """The policy version that drew each completion token, when new weights took over during
    its decoding (partial rollouts); empty: every token is ``policy_version``'s."""

    @property
    def model_turns(self) -> int:
        """Model turns the episode used (what a by-round metric counts); 1 for one completion."""
        return len(self.turns) or 1

    @property
    def token_versions(self) -> list[int]:
        """The policy version that drew each completion token."""
        return self.versions or [self.policy_version] * len(self.completion_ids)

    def __post_init__(self) -> None:
        if not self.loss_mask:
            self.loss_mask = [1] * len(self.completion_ids)
        if not (len(self.completion_ids) == len(self.logprobs) == len(self.loss_mask)):
            raise ValueError(
                "completion_ids, logprobs and loss_mask must have one entry per completion token"
            )
        if self.versions and len(self.versions) != len(self.completion_ids):
            raise ValueError("versions must be empty or hold one entry per completion token")


@dataclass
class Group:
    """The G rollouts sampled for one problem; advantages are relative within a group."""

    problem: Problem
    rollouts: list[Rollout]

    @property
    def rewards_G(self) -> torch.Tensor:
        return torch.tensor([r.reward for r in self.rollouts], dtype=torch.float32)


@dataclass
class Round:
    """One sampling round: the scored groups of a draw of problems, their reward means, and
    what the round cost (the pipeline makes rounds; a step trains on one or more)."""

    groups: list[Group]
    record: dict[str, float]
    """Means over the round's rollouts of each reward and its components."""
    version: int
    """Policy version that sampled the round."""
    generate_s: float
    reward_s: float
    sync_s: float = 0.0
    """Seconds the rollout worker spent taking new weights before this round."""
    staleness: int = 0
    """Learner versions between the learner that took the round and the oldest policy among
    the rollouts it kept (each rollout's own ``policy_version`` is what decides)."""
    sampler: Optional[dict[str, float]] = None
    """What the sampler reported after the round (servers' versions, state, failovers), as
    step-record keys; None when it reports nothing."""
    tally: Optional[dict] = None
    """What the round adds to the pipeline's counts (rollouts sampled, outage rounds, per task
    sampled and dropped), added when the learner takes it, so that the counts a step logs do
    not depend on how far sampling ran ahead; None once added."""


@dataclass
class Batch:
    """Right-padded learner input: one row per rollout, prompt then completion.

    ``loss_mask_BT`` is 1 exactly on trained completion tokens; ``old_logprobs_BT`` and
    ``advantages_BT`` are aligned with ``input_ids_BT`` (position t holds the value for the
    token at t, predicted from positions < t) and are 0 where the mask is 0. ``values_BT``
    (the critic's estimates when the advantages were computed) and ``returns_BT`` (its
    targets) are set only when a critic is trained.
    """

    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    loss_mask_BT: torch.Tensor
    old_logprobs_BT: torch.Tensor
    advantages_BT: torch.Tensor
    policy_versions_B: torch.Tensor
    values_BT: Optional[torch.Tensor] = None
    returns_BT: Optional[torch.Tensor] = None
    prox_logprobs_BT: Optional[torch.Tensor] = None
    """Log-probs under the learner's weights at the start of its step (off-policy correction)."""
    weights_B: Optional[torch.Tensor] = None
    """Per-row multiplier of the policy loss (per-domain balance); None = 1."""
    prompt_lengths_B: Optional[torch.Tensor] = None
    """Tokens of each row's prompt, so that rows with the same prompt can share its forward pass."""
    group_B: Optional[torch.Tensor] = None
    """Index of each row's group in the step's batch, for a loss that pairs a group's rows."""

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask_BT.sum().item())

    def __len__(self) -> int:
        return self.input_ids_BT.shape[0]

    def to(self, device: torch.device) -> "Batch":
        """The batch with every tensor on ``device`` (itself when they are all there already)."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        moved = {name: t.to(device) for name, t in tensors.items() if t.device != torch.device(device)}
        return replace(self, **moved) if moved else self

    def select(self, rows: slice | torch.Tensor) -> "Batch":
        """A sub-batch of the given rows (a micro-batch), trimmed of all-padding columns."""
        mask = self.attention_mask_BT[rows]
        width = int(mask.sum(dim=1).max().item()) if mask.numel() else 0
        return Batch(
            input_ids_BT=self.input_ids_BT[rows, :width],
            attention_mask_BT=mask[:, :width],
            loss_mask_BT=self.loss_mask_BT[rows, :width],
            old_logprobs_BT=self.old_logprobs_BT[rows, :width],
            advantages_BT=self.advantages_BT[rows, :width],
            policy_versions_B=self.policy_versions_B[rows],
            values_BT=None if self.values_BT is None else self.values_BT[rows, :width],
            returns_BT=None if self.returns_BT is None else self.returns_BT[rows, :width],
            prox_logprobs_BT=None if self.prox_logprobs_BT is None else self.prox_logprobs_BT[rows, :width],
            weights_B=None if self.weights_B is None else self.weights_B[rows],
            prompt_lengths_B=None if self.prompt_lengths_B is None else self.prompt_lengths_B[rows],
            group_B=None if self.group_B is None else self.group_B[rows],
        )


def episode_totals(turns: list) -> tuple[dict[str, float], dict[str, float]]:
    """An episode's rewards and info counters, each summed over its turns."""
    rewards: dict[str, float] = {}
    info: dict[str, float] = {}
    for turn in turns:
        for key, value in turn.rewards.items():
            rewards[key] = rewards.get(key, 0.0) + value
        for key, value in turn.info.items():
            info[key] = info.get(key, 0.0) + value
    return rewards, info


def transcript(rollout: Any) -> str:
    """A rollout as a reader wants it: one completion's text, or an episode's model turns each
    followed by what the environment said (messages as ``[role] content`` lines)."""
    if not rollout.turns:
        return rollout.text
    parts = []
    for turn in rollout.turns:
        parts.append(turn.text)
        if isinstance(turn.observation, str):
            parts.append(turn.observation)
        elif turn.observation:
            lines = "".join(f"[{m['role']}] {m['content']}\n" for m in turn.observation)
            parts.append(lines if turn.text.endswith("\n") else "\n" + lines)
    return "".join(parts)
