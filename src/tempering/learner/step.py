"""One learner step on a batch: ``ppo_epochs`` passes of ``mini_batches`` optimizer updates.

The learner owns the trainable state (policy, optional critic, optimizer, LR schedule, KL
coefficient, policy version) and nothing else: batches arrive with advantages already
computed. Before they are computed, it supplies what estimators may need from models: the
critic's values (:meth:`Learner.values`), a KL penalty folded into the reward
(:meth:`Learner.reward_penalty`) and a frozen teacher's log-probs for distillation
(:meth:`Learner.teacher_logprobs`; the teacher is loaded from its config on every start, so
checkpoints do not hold it).

Each update's loss is ``tempering.algorithms.objective.objective``: the policy loss times the
behaviour weight and the row weight, minus the entropy bonus, plus the KL term (when in the
loss) and the clipped value loss (with a critic), aggregated over the mini-batch; the learner
runs the models that give it its tensors.
Micro-batches accumulate gradients; aggregation is normalised by mini-batch counts, so an
update does not depend on the micro-batch size beyond floating-point summation order.
Importance ratios are always against the sampler's log-probs, so later updates of a batch
are corrected for having moved away from the sampling policy. The step's first update,
before any weight moves, also measures how far its log-probs are from the sampler's on the
same tokens (``mismatch/abs_logp``, ``mismatch/k3``, ``mismatch/outside_clip``;
``tempering.algorithms.kl.mismatch``), at no extra forward pass: the sampler and the
learner are two implementations of one policy (bf16, other kernels, an inference server),
and this is their disagreement (plus staleness, for stale rollouts).

The LR schedule and the policy version advance once per batch, however many updates it
takes. An update whose gradient is not finite is skipped (counted as ``skipped_updates``),
never applied; deciding what to do about repeated ones is the loop's job.

Stale rollouts (sampled by an older policy, in asynchronous mode) are corrected with
``off_policy``: ``"none"`` takes ratios against the sampler's log-probs as usual;
``"tis"`` and ``"decoupled"`` take them against the *proximal* policy (these weights at the
start of the step) and multiply each token's loss by the behaviour weight
``pi_prox / pi_sampler`` (detached), truncated at ``is_cap`` for ``"tis"`` and left whole
for ``"decoupled"``. When the step makes one update (one epoch, one mini-batch), the
weights it differentiates are the proximal policy, so ``pi_prox`` is its own forward pass,
detached; otherwise an extra pass computes it first, and only for batches holding
rollouts older than the learner's version. With ``mismatch_correction`` (a sampler that is not
the learner: vLLM, a server, bf16 sampling) every batch is corrected the same way, fresh ones
too, by that variant of ``tempering.algorithms.correction`` in place of the behaviour weight
above. Rows may carry ``weights_B``, multiplied into their policy loss (the
scheduler's per-domain balance); :meth:`Learner.grad_shares` measures what each domain's rows
then contribute to the gradient's norm, without stepping (``learner.grad_share_every``).

How a batch becomes forward passes is planned once per update by ``tempering.learner.plan`` (the
proximal pass and, with one mini-batch, every update of the step execute the same plan):
rows without signal are left out and identical rows computed once, weighted by their count,
when each row's loss stands alone (:meth:`Learner._rows_stand_alone`;
``learner.skip_zero_advantage``, ``learner.merge_duplicates``); the rest are cut into
micro-batches of ``micro_batch_size`` rows or at most ``token_budget`` tokens, each padded,
packed, or sharing its rows' prompts when that computes fewer tokens (``learner.packing``,
``learner.share_prompts``). Log-probs are computed only on trained tokens, from the model's
logits or chunk by chunk from its hidden states (``tempering.learner.forward``). None of
this changes the update beyond floating-point summation order. Gradient
checkpointing trades compute for memory; bf16 autocast trades precision for speed and memory
(on CPU with attention as batched bf16 products for short rows and in fp32 for long ones,
see ``tempering.models.attention``).

Batches move to the device of the policy's parameters (where the reference model and the
critic are too), autocast is of that device's type, and every tensor the step makes is made
there; values handed back for advantages (:meth:`Learner.values`,
:meth:`Learner.reward_penalty`) are on the batch's own device.
"""

from __future__ import annotations

import copy
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from tempering import faults
from tempering.algorithms import kl_estimate
from tempering.algorithms.correction import CORRECTIONS
from tempering.algorithms.kl import MISMATCH_KEYS, KLCoefficient, mismatch
from tempering.algorithms.losses import masked_mean, needs_reference, paired, zero_at_zero_advantage
from tempering.algorithms.objective import ObjectiveInputs, ObjectiveSettings, objective
from tempering.learner.critic import Critic
from tempering.learner.forward import can_share_prompts, forward_logprobs, plain_head
from tempering.learner.optim import guarded_step
from tempering.learner.parallel import DataParallel, gather_into, idle_pass, load_optimizer_state, optimizer_state
from tempering.learner.plan import MicroBatch, PlanChoices, UpdatePlan, computed_batch, plan_update
from tempering.models.attention import upcast_attention
from tempering.models.compat import enable_checkpointing
from tempering.models.lora import adapter_state, adapters_off, is_adapted, load_adapter_state
from tempering.types import Batch, Rollout


def collate(rollouts: list[Rollout], pad_id: int, device: torch.device | str = "cpu") -> Batch:
    """Right-padded batch of prompt+completion rows with per-token mask and old log-probs, on
    ``device`` (filled on CPU row by row, then moved in one copy per tensor)."""
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    n, cpu = len(rollouts), torch.device("cpu")
    input_ids_BT = torch.full((n, width), pad_id, dtype=torch.long, device=cpu)
    attention_BT = torch.zeros((n, width), dtype=torch.long, device=cpu)
    loss_mask_BT = torch.zeros((n, width), device=cpu)
    old_logprobs_BT = torch.zeros((n, width), device=cpu)
    for row, r in enumerate(rollouts):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids_BT[row, : p + c] = torch.tensor(r.prompt_ids + r.completion_ids, device=cpu)
        attention_BT[row, : p + c] = 1
        loss_mask_BT[row, p : p + c] = torch.tensor(r.loss_mask, dtype=torch.float32, device=cpu)
        old_logprobs_BT[row, p : p + c] = torch.tensor(r.logprobs, device=cpu)
    batch = Batch(
        input_ids_BT=input_ids_BT, attention_mask_BT=attention_BT, loss_mask_BT=loss_mask_BT,
        old_logprobs_BT=old_logprobs_BT * loss_mask_BT, advantages_BT=torch.zeros((n, width), device=cpu),
        policy_versions_B=torch.tensor([r.policy_version for r in rollouts], device=cpu),
        prompt_lengths_B=torch.tensor([len(r.prompt_ids) for r in rollouts], device=cpu),
    )
    return batch.to(device)


OFF_POLICY = ("none", "tis", "decoupled")


@dataclass(kw_only=True)
class LearnerSettings(ObjectiveSettings):
    """How the learner computes an update: the objective's settings and these. Every field is
    required: ``tempering.build.learner_settings`` fills them from the config, so a test that
    builds them there runs a real run's path."""

    kl_coef: float
    """The KL coefficient to start from; 0 = no reference model."""
    kl_in_reward: bool
    kl_target: float
    kl_horizon: int
    critic: Optional[str]
    """None, "head" (a value head on the policy) or "model" (a separate critic model)."""
    ppo_epochs: int
    mini_batches: int
    temperature: float
    micro_batch_size: int
    token_budget: int
    """Tokens per micro-batch (rows x width as the model sees them); 0 = ``micro_batch_size`` rows."""
    packing: bool
    logprob_chunk: int
    """Tokens of logits at a time; 0 = the model's whole logits at once."""
    gradient_checkpointing: bool
    grad_clip: float
    bf16: bool
    skip_zero_advantage: bool
    """Leave rows whose advantages are all 0 out of the forward pass when that is exact."""
    share_prompts: bool
    """Rows with the same prompt share its forward pass (``tempering.learner.forward``)."""
    merge_duplicates: bool
    """Identical rows are computed once, weighted by their count, when that is exact."""


class Learner:
    def __init__(self, model: Any, optimizer: torch.optim.Optimizer,
                 schedule: Callable[[int], float], settings: LearnerSettings, teacher: Optional[Any] = None,
                 parallel: Optional[DataParallel] = None, whole: Optional[Any] = None):
        self.model = model
        self.parallel = parallel
        self.whole = whole  # fsdp: the leader's unsharded copy of the policy, gathered after each step
        self._sharded = parallel is not None and parallel.kind == "fsdp"
        self.optimizer = optimizer
        self.settings = settings
        if settings.bf16:
            upcast_attention(model)
        if settings.gradient_checkpointing:
            enable_checkpointing(model)
        self._shares_prompts = settings.share_prompts and can_share_prompts(model)  # fixed from here on
        self.teacher = teacher
        self._teacher_kl: Optional[float] = None
        if teacher is not None:
            teacher.eval().requires_grad_(False)
            if settings.bf16:
                upcast_attention(teacher)
            # another architecture may lack what the policy's passes use
            self._teacher_passes = (settings.share_prompts and can_share_prompts(teacher),
                                    settings.logprob_chunk if plain_head(teacher) else 0)
        self.critic: Optional[Critic] = None
        if settings.critic is not None:
            self.critic = Critic(model, shared=settings.critic == "head")
            optimizer.add_param_group({"params": self.critic.parameters()})
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        self.reference: Optional[Any] = None
        # a KL term's or a preference loss's; with LoRA, the base under the adapters is the initial policy
        if settings.kl_coef > 0 or needs_reference(settings.loss):
            self.reference = model if is_adapted(model) else copy.deepcopy(model).eval().requires_grad_(False)
        self.kl = KLCoefficient(settings.kl_coef, settings.kl_target, settings.kl_horizon)
        self._reward_kl: Optional[float] = None
        self.version = 0
        if settings.off_policy not in OFF_POLICY:
            raise ValueError(f"off_policy={settings.off_policy!r}; known: {', '.join(OFF_POLICY)}")
        if settings.mismatch_correction != "none" and settings.mismatch_correction not in CORRECTIONS:
            raise ValueError(f"mismatch_correction={settings.mismatch_correction!r}; known: none, {', '.join(CORRECTIONS)}")

    def state_dict(self) -> dict[str, Any]:
        """Everything but the policy's own weights (saved with ``save_pretrained``); with LoRA,
        the adapters' weights too, which a merged checkpoint could not give back exactly.
        Under ``fsdp`` the leader's call gathers the optimizer state whole (every rank joins)."""
        if self._sharded and self.parallel.leads:
            self.parallel.tell("state_dict")
        optimizer = optimizer_state(self.model, self.optimizer) if self._sharded else self.optimizer.state_dict()
        state: dict[str, Any] = {
            "optimizer": optimizer, "scheduler": self.scheduler.state_dict(),
            "version": self.version, "kl_coef": self.kl.value,
        }
        if is_adapted(self.model):
            state["adapter"] = adapter_state(self.model)
        if self.critic is not None:
            state["critic_head"] = self.critic.head.state_dict()
            if not self.critic.shared:
                state["critic_trunk"] = self.critic.trunk.state_dict()
        if self.reference is not None and self.reference is not self.model:
            state["reference"] = self.reference.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state of :meth:`state_dict`; among several learners, the leader's call (made
        after it loaded the policy's weights, under ``fsdp`` into its whole copy) gives every rank the
        state and its weights."""
        if self.parallel is not None:
            if self.parallel.leads:
                self.parallel.tell("load_state_dict", state)
            self.parallel.share_weights(self.model, self.whole)
        if self._sharded:
            load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = state["version"]
        self.kl.value = state["kl_coef"]
        if "adapter" in state:
            load_adapter_state(self.model, state["adapter"])
        if self.critic is not None:
            self.critic.head.load_state_dict(state["critic_head"])
            if not self.critic.shared:
                self.critic.trunk.load_state_dict(state["critic_trunk"])
        if "reference" in state:
            self.reference.load_state_dict(state["reference"])

    def load_weights(self, weights: Optional[dict[str, torch.Tensor]]) -> None:
        """The policy's whole weights (a driver's copy of them, ``pipeline.learner=ray``); among
        several learners, the leader's call gives every rank them (the others are told, with None)."""
        if self.parallel is not None and self.parallel.leads:
            self.parallel.tell("load_weights", None)
        if weights is not None:
            (self.whole if self.whole is not None else self.model).load_state_dict(weights)
        if self.parallel is not None:
            self.parallel.share_weights(self.model, self.whole)

    @property
    def device(self) -> torch.device:
        """Where the policy's parameters are: batches move there, and autocast is of its type."""
        return next(self.model.parameters()).device

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.settings.bf16 else nullcontext()

    def plan(self, batch: Batch, every_row: bool = False, teacher: bool = False) -> UpdatePlan:
        """The plan of an update on ``batch`` (``tempering.learner.plan``), with what it may skip or
        merge decided by :meth:`_rows_stand_alone`; ``every_row`` computes each row as it is,
        for values every row needs; ``teacher`` lays the passes out as the teacher can run them."""
        s = self.settings
        alone = not every_row and self._rows_stand_alone()
        pairs = paired(s.loss)  # a row's loss needs its group's other rows: never merged, never apart
        shares, chunk = self._teacher_passes if teacher else (self._shares_prompts, s.logprob_chunk)
        return plan_update(batch, PlanChoices(
            skip_zero_advantage=s.skip_zero_advantage and alone,
            merge_duplicates=s.merge_duplicates and alone and not pairs, share_prompts=shares, packing=s.packing,
            token_budget=s.token_budget, micro_batch_size=s.micro_batch_size, chunk=chunk, keep_groups=pairs))

    def _logprobs(self, model: Any, micro: Batch, part: MicroBatch, **options: bool):
        """``forward_logprobs`` of ``model`` on the micro-batch's trained tokens, laid out as planned."""
        return forward_logprobs(model, micro.input_ids_BT, micro.attention_mask_BT, self.settings.temperature,
                                keep_BT=micro.loss_mask_BT, layout=part.layout, chunk=part.chunk,
                                prompt_lengths_B=micro.prompt_lengths_B, **options)

    def _reference_logprobs(self, micro: Batch, part: MicroBatch) -> torch.Tensor:
        """The reference's log-probs (the KL term's, a preference loss's): the frozen copy, or this
        model with its adapters off."""
        with adapters_off(self.reference):
            return self._logprobs(self.reference, micro, part).logprobs_BT

    def _per_row(self, batch: Batch, plan: UpdatePlan, fn: Callable[[Batch, MicroBatch], torch.Tensor]
                 ) -> torch.Tensor:
        """``fn`` over the plan's micro-batches without gradient (on the model's device), put
        back on the batch's rows at full width (merged copies take their row's values, rows not
        computed 0), on the batch's device."""
        computed = computed_batch(batch, plan)
        computed_BT = torch.zeros_like(computed.loss_mask_BT)
        for part in plan.micro_batches:
            rows = torch.tensor(part.rows, device=computed_BT.device)
            micro = computed.select(rows).to(self.device)
            with torch.no_grad(), self._autocast():
                part_BT = fn(micro, part).float()
            computed_BT[rows, : part_BT.shape[1]] = part_BT.to(computed_BT.device)
        source_B = torch.tensor(plan.source, device=computed_BT.device)
        out_BT = torch.zeros_like(batch.loss_mask_BT)
        out_BT[source_B >= 0, : computed_BT.shape[1]] = computed_BT[source_B[source_B >= 0]]
        return out_BT * batch.loss_mask_BT

    def values(self, batch: Batch) -> Optional[torch.Tensor]:
        """The critic's values on the batch's trained tokens, or None without a critic."""
        if self.critic is None:
            return None
        return self._per_row(batch, self.plan(batch, every_row=True),
                             lambda micro, _: self.critic.values(micro.input_ids_BT, micro.attention_mask_BT))

    def reward_penalty(self, batch: Batch) -> Optional[torch.Tensor]:
        """``kl_coef * KL(sampler || reference)`` per trained token, to subtract from the reward,
        or None unless the KL is folded into the reward. Uses the sampler's log-probs, so only
        the reference runs."""
        s = self.settings
        if self.reference is None or not s.kl_in_reward:
            return None
        ref_BT = self._per_row(batch, self.plan(batch, every_row=True), self._reference_logprobs)
        kl_BT = kl_estimate(batch.old_logprobs_BT, ref_BT, s.kl_estimator, s.kl_clamp) * batch.loss_mask_BT
        self._reward_kl = masked_mean(kl_BT, batch.loss_mask_BT)
        return self.kl.value * kl_BT

    def teacher_logprobs(self, batch: Batch) -> Optional[torch.Tensor]:
        """The teacher's log-probs of the batch's trained tokens (at the sampling temperature,
        like the sampler's), or None without a teacher; a pass like the reference's. Measures the
        per-token reverse KL(sampler || teacher), reported by the next :meth:`step` as ``teacher_kl``."""
        if self.teacher is None:
            return None
        teacher_BT = self._per_row(batch, self.plan(batch, every_row=True, teacher=True),
                                   lambda micro, part: self._logprobs(self.teacher, micro, part).logprobs_BT)
        self._teacher_kl = masked_mean(kl_estimate(batch.old_logprobs_BT, teacher_BT, "k1"), batch.loss_mask_BT)
        return teacher_BT

    def _micro_step(self, micro: Batch, part: MicroBatch, tokens: int, sequences: int,
                    prox_from_forward: bool, measure: bool = False) -> dict[str, float]:
        """One forward and backward pass; with ``measure``, also the mismatch/* metrics of its
        log-probs against the sampler's (a pass before the step's first update)."""
        s = self.settings
        shared_critic = self.critic is not None and self.critic.shared
        with self._autocast():
            out = self._logprobs(self.model, micro, part, with_entropy=True, entropy_grad=s.entropy_coef > 0,
                                 with_hidden=shared_critic)
            logprobs_BT, entropy_BT = out.logprobs_BT, out.entropy_BT
        mask_BT = micro.loss_mask_BT
        prox_BT = micro.prox_logprobs_BT
        if measure:
            mismatch_metrics = mismatch(logprobs_BT.detach().float(), micro.old_logprobs_BT, mask_BT,
                                        s.clip_low, s.clip_high)
        if prox_from_forward:  # the step's one update: its weights are the proximal policy
            prox_BT = logprobs_BT.detach().float() * mask_BT
        ref_BT = values_BT = None
        if self.reference is not None and (not s.kl_in_reward or needs_reference(s.loss)):
            with torch.no_grad(), self._autocast():
                ref_BT = self._reference_logprobs(micro, part)
        if self.critic is not None:
            with self._autocast():
                values_BT = (self.critic.values_from_hidden(out.hidden_BTH) if shared_critic
                             else self.critic.values(micro.input_ids_BT, micro.attention_mask_BT)).float()
        loss, metrics = objective(ObjectiveInputs(
            logprobs_BT=logprobs_BT, sampler_logprobs_BT=micro.old_logprobs_BT, advantages_BT=micro.advantages_BT,
            mask_BT=mask_BT, entropy_BT=entropy_BT, batch_tokens=tokens, batch_sequences=sequences,
            prox_logprobs_BT=prox_BT, weights_B=micro.weights_B, ref_logprobs_BT=ref_BT,
            kl_coef=0.0 if s.kl_in_reward else self.kl.value, group_B=micro.group_B,
            values_BT=values_BT, old_values_BT=micro.values_BT, returns_BT=micro.returns_BT), s)
        loss.backward()
        if measure:
            metrics.update(mismatch_metrics)
        return metrics

    def _rows_stand_alone(self) -> bool:
        """Whether each row's part of the loss is its policy loss alone: a built-in loss (or a
        plug-in declared ``zero_at_zero_advantage``), no entropy bonus, KL term in the loss or
        critic. Aggregation sums rows' token losses with the whole batch's counts as
        normalisers, so a row's contribution is then its own, whatever else is computed. A
        paired loss (``online_dpo``) that declares ``zero_at_zero_advantage`` qualifies for
        skipping: a row without advantage is in no pair, so no other row's loss reads it (its
        rows are never merged, see :meth:`plan`)."""
        s = self.settings
        return (zero_at_zero_advantage(s.loss) and s.entropy_coef == 0
                and (s.kl_coef == 0 or s.kl_in_reward) and self.critic is None)

    def _update(self, batch: Batch, prox_from_forward: bool = False,
                plan: Optional[UpdatePlan] = None, measure: bool = False) -> dict[str, float]:
        """One optimizer update on a (mini-)batch, accumulated over micro-batches, as ``plan``
        says (:meth:`plan` when None).

        The metrics describe the rows computed; ``skipped_rows`` and ``merged_rows`` count
        the others. With ``prox_from_forward`` the proximal log-probs are this update's own
        forward pass; with ``measure`` (the step's first update) the mismatch/* metrics are taken."""
        tokens, sequences = batch.num_tokens, len(batch)  # the whole batch's, on every rank
        if self.parallel is not None:
            batch = self.parallel.rows(batch)
        plan = plan or self.plan(batch)
        computed = computed_batch(batch, plan)
        computed_tokens = self.parallel.total(computed.num_tokens) if self.parallel else computed.num_tokens
        totals: dict[str, float] = {"skipped_rows": float(plan.skipped), "merged_rows": float(plan.merged),
                                    "micro_batches": float(len(plan.micro_batches))}
        for part in self._aligned(plan.micro_batches):
            if part is None:
                idle_pass(self.model, self.device, grad=True)
                continue
            micro = computed.select(torch.tensor(part.rows, device=computed.loss_mask_BT.device))
            weight = micro.num_tokens / max(computed_tokens, 1)
            for key, value in self._micro_step(micro, part, tokens, sequences, prox_from_forward, measure).items():
                totals[key] = totals.get(key, 0.0) + (value if key == "loss" else value * weight)
        if self.parallel is not None:
            totals = self.parallel.sum_metrics(totals)
            self.parallel.sum_gradients(p for group in self.optimizer.param_groups for p in group["params"])
        faults.point("learn")
        totals["grad_norm"], stepped = guarded_step(self.optimizer, totals["loss"], self.settings.grad_clip)
        totals["skipped_updates"] = 0.0 if stepped else 1.0
        return totals

    def _aligned(self, parts: list[MicroBatch]) -> list[Optional[MicroBatch]]:
        """The micro-batches, followed under ``fsdp`` by idle passes (None) up to the most any
        rank runs: every rank must join every pass's collectives."""
        if self.parallel is None or self.parallel.kind != "fsdp":
            return list(parts)
        return [*parts, *[None] * (self.parallel.most(len(parts)) - len(parts))]

    def proximal_logprobs(self, batch: Batch, plan: UpdatePlan) -> torch.Tensor:
        """The current weights' log-probs on the rows ``plan`` computes; the sampler's on the
        others (rows without signal, whose loss is 0 whatever the correction)."""
        prox_BT = self._per_row(batch, plan, lambda micro, part: self._logprobs(self.model, micro, part).logprobs_BT)
        computed_B = torch.tensor(plan.source, device=prox_BT.device) >= 0
        return torch.where(computed_B[:, None], prox_BT, batch.old_logprobs_BT)

    def _mini_batches(self, size: int, epoch: int) -> list[torch.Tensor | slice]:
        """Rows of each mini-batch: the batch in order when there is one, else a permutation
        that depends only on the policy version and the epoch (so a resumed run repeats it,
        on any device: it is drawn on CPU)."""
        if self.settings.mini_batches == 1:
            return [slice(0, size)]
        order = torch.randperm(size, generator=torch.Generator().manual_seed(self.version * 1000 + epoch),
                               device="cpu")
        return [rows for rows in torch.tensor_split(order, self.settings.mini_batches) if len(rows)]

    def grad_shares(self, batch: Batch, domains_B: Sequence[str]) -> dict[str, float]:
        """Each domain's share of the gradient, measured: ``domain/<name>/grad_share`` =
        ``|g_d| / sum over domains of |g_d'|``, where ``g_d`` is the gradient (over every trained
        parameter) of domain ``d``'s rows' part of the step's objective, at the weights the
        step starts from, with the whole batch's token and sequence counts as the aggregation's
        normalisers (the objective is a sum over rows, so the parts add up to the step's
        gradient; a share is a ratio, so the normalisers drop out of it).

        Cost: one forward and backward pass over each domain's rows in turn (what one update of
        the batch costs, split by domain), and no optimizer step; the gradients are cleared
        after. The loop calls it every ``learner.grad_share_every`` steps. Under ``fsdp`` a rank
        holds a shard of the gradient only, so the build refuses the option there; under
        ``ddp`` the leader measures the whole batch alone (its gradients are summed by hand,
        after the step's passes, which this never reaches)."""
        batch = batch.to(self.device)
        stale = bool((batch.policy_versions_B < self.version).any())
        corrected = (self.settings.off_policy != "none" and stale) or self.settings.mismatch_correction != "none"
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        tokens, sequences = batch.num_tokens, len(batch)
        norms: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        for domain in dict.fromkeys(domains_B):
            rows = torch.tensor([i for i, d in enumerate(domains_B) if d == domain], device=self.device)
            part_batch = batch.select(rows)
            plan = self.plan(part_batch)
            computed = computed_batch(part_batch, plan)
            for part in plan.micro_batches:
                micro = computed.select(torch.tensor(part.rows, device=self.device))
                # at these weights the forward pass is the proximal policy
                self._micro_step(micro, part, tokens, sequences, prox_from_forward=corrected)
            grads = [p.grad.detach().float().flatten() for p in parameters if p.grad is not None]
            norms[domain] = float(torch.cat(grads).norm()) if grads else 0.0
            self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        total = sum(norms.values())
        return {f"domain/{d}/grad_share": (n / total if total > 0 else 0.0) for d, n in norms.items()}

    def step(self, batch: Batch) -> dict[str, float]:
        """Learn from one batch; returns metrics averaged over its updates (``micro_batches``:
        forward/backward passes per update) and two counts: ``updates`` made and
        ``skipped_updates``, those not applied because the loss or gradient was not finite.
        Among several learners, the leader's call hands the batch to the others (``tempering.learner.parallel``)."""
        if self.parallel is not None and self.parallel.leads:
            self.parallel.tell("step", batch)
        batch = batch.to(self.device)
        stale = bool((batch.policy_versions_B < self.version).any())
        # fresh batches need no correction for staleness, but every batch may for the sampler's engine
        corrected = (self.settings.off_policy != "none" and stale) or self.settings.mismatch_correction != "none"
        whole = self.settings.mini_batches == 1  # then every update's mini-batch is the batch
        prox_from_forward = corrected and self.settings.ppo_epochs == 1 and whole
        prox_pass = corrected and not prox_from_forward
        # the proximal pass's, and each update's (each rank plans its own share of an update)
        plan = self.plan(batch) if whole or prox_pass else None
        update_plan = plan if whole and self.parallel is None else None
        if prox_pass:
            batch.prox_logprobs_BT = self.proximal_logprobs(batch, plan)
        self.model.train()
        lr = self.optimizer.param_groups[0]["lr"]
        parts = [rows for epoch in range(self.settings.ppo_epochs) for rows in self._mini_batches(len(batch), epoch)]
        updates = [self._update(batch.select(rows), prox_from_forward, update_plan, measure=k == 0)
                   for k, rows in enumerate(parts)]
        # the mismatch is the first update's alone: later ones see weights the sampler never had
        totals = {key: sum(u[key] for u in updates) / len(updates) for key in updates[0] if key not in MISMATCH_KEYS}
        totals.update({key: updates[0][key] for key in MISMATCH_KEYS if key in updates[0]})
        totals["skipped_updates"] = sum(u["skipped_updates"] for u in updates)
        totals["updates"] = len(updates)
        with warnings.catch_warnings():  # torch warns when every optimizer step was skipped
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        self.model.eval()
        if self._sharded:  # every rank joins; the leader samples with the gathered weights
            gather_into(self.model, self.whole)
        self.version += 1
        if self.reference is not None:
            totals["kl_coef"] = self.kl.value
            if self.settings.kl_in_reward:
                # measured by reward_penalty() when this batch's advantages were computed
                kl, self._reward_kl = self._reward_kl, None
                if kl is not None:
                    totals["kl"] = kl
            if "kl" in totals:
                self.kl.update(totals["kl"])
        if self._teacher_kl is not None:
            totals["teacher_kl"], self._teacher_kl = self._teacher_kl, None
        totals["lr"] = lr
        return totals
