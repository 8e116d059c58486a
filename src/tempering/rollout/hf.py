"""Batched sampling with a Hugging Face causal LM, keeping exact token ids and log-probs.

The sampler is a plain KV-cached decoding loop rather than ``model.generate``: it records,
for every sampled token, its log-probability under the temperature-scaled distribution,
which is what the learner recomputes (``tempering.learner.forward``) to form importance
ratios. Top-p truncation changes which tokens can be drawn, not the recorded log-probs.

Where the time goes, and what is done about it:

- the cache holds *histories*, the distinct token sequences decoded so far, not rows: a
  prompt is prefilled once, however many of its group's samples share the batch, and its
  samples are decoded as one row for as long as they draw the same tokens; each draws its
  own token from that row's distribution, and a sample that draws a different one gets a
  cache row of its own, copied from the one it leaves (:func:`continue_histories`). The
  distributions and log-probs are those of separate rows (the same computation), so this
  changes no number; it saves most of a step where a policy is confident (``share=False``
  gives every sample its own row);
- a row that ends (end-of-sequence or a stop string) leaves the running batch at once, with
  its cache rows, so a decoding step costs what the live histories cost;
- the cache is a preallocated buffer written in place (transformers' ``DynamicLayer``
  copies a layer's whole cache to append one position);
- a token is drawn by inverting the cumulative distribution with one uniform number per row
  (``torch.multinomial`` draws one exponential number per vocabulary entry), and top-p
  sorts only the leading candidates;
- optional bfloat16 autocast (``bf16=True``), faster where the CPU has native bf16
  (AVX512-BF16, AMX) and on GPUs; the recorded log-probs are then those of the bf16 forward
  pass (taken in float32 from its logits), so a learner that recomputes in float32 differs
  from them by about 1e-2 per token.

Prompts are left-padded with explicit position ids, so a row's numbers do not depend on
what it was batched with (up to floating-point summation order). Draws come from the
``torch.Generator`` passed in, so the same problems, parameters and seed give the same
rollouts. The sampler runs where the model's parameters are (cache, masks, every tensor it
makes); the uniform numbers are drawn on the generator's device (a run's seeded generator is
on CPU) and moved to the logits', and the log-probs come back as Python floats.

New weights may take over in the middle of a call (partial rollouts, ``tempering.pipeline``):
``updates``, when set, is asked between decoding steps whether it loaded new weights into the
model. When it did, the cache of every live history is computed again from its prompt and
tokens so far with the new weights (one prefill, at the positions it had), rather than kept:
kept keys and values of the old weights would make the next tokens' distributions a mix of
both policies, and their recorded log-probs the log-probs of no policy the learner can
compute. Recomputed, each token after the update is drawn from the new policy given its
prefix, and its log-prob is that policy's (up to floating-point order), which is what the
learner's off-policy correction divides by. The cost is one prefill of the live rows per update.

Not done here: attention over a prefix shared by histories that have diverged (each keeps
its own copy of the keys and values before the point where it left), speculative decoding,
continuous batching across calls.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import Callable, Optional

import torch

from tempering.models.compat import (attention_shape, cache_argument, fused_llama_supported, logits_to_keep_argument,
                                     preallocated_cache, select_cache_rows)
from tempering.models.lora import unwrapped
from tempering.rollout import fast_llama
from tempering.rollout.base import RowStreams, SamplingParams
from tempering.rollout.prompts import encode_prompt, fit_prompt, prompt_limit, use_chat_template
from tempering.types import Group, Problem, Prompt, Rollout

StepHook = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Optional[tuple[torch.Tensor, torch.Tensor]],
                     torch.Tensor], Optional[torch.Tensor]]
"""Called after each decoding step (:meth:`HFGenerator.sample_with_alternatives`); returns rows to end, or None."""

_BLOCK = 256  # vocabulary entries per block when inverting the cumulative distribution
CACHE_BUDGET_BYTES = 4 << 30
"""Most bytes of key/value cache one batch of :meth:`HFGenerator.generate` may hold: where
prompts are long, rows are cut finer than ``batch_size`` (256 rows of 4,096-token prompts, the
default evaluation batch, would hold 46 GB of SmolLM2-135M's cache in float32)."""
_UNPROCESSED = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": (),
                "min_tokens": 0}  # the settings under which the logits are drawn from as the model gives them


def _top_p_filter(probs_BV: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs in descending order with the tail beyond cumulative mass top_p zeroed, their
    token ids)``; the most likely token is always kept.

    Only the top k are sorted, k growing until they hold more than ``top_p`` in every row
    (every token after them is then outside the nucleus): a small model's nucleus at
    temperature 1 is a few hundred tokens, and sorting a whole vocabulary per row costs more
    than the forward pass."""
    width = probs_BV.shape[-1]
    k = min(256, width)
    sorted_BE, order_BE = probs_BV.topk(k, dim=-1)
    while k < width and not bool((sorted_BE.sum(dim=-1) > top_p).all()):
        k = 4 * k if 4 * k <= width // 4 else width
        sorted_BE, order_BE = probs_BV.topk(k, dim=-1) if k < width else probs_BV.sort(dim=-1, descending=True)
    outside_BE = sorted_BE.cumsum(dim=-1) - sorted_BE > top_p
    return sorted_BE.masked_fill_(outside_BE, 0.0), order_BE


def _below(value: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """``value``, or the largest float under ``bound`` where rounding reached it."""
    return torch.minimum(value, bound.nextafter(torch.zeros_like(bound)))


def _inverse_cdf(weights_BV: torch.Tensor, uniform_B: torch.Tensor) -> torch.Tensor:
    """Index drawn from each row of non-negative, unnormalised ``weights_BV`` with one uniform
    number in [0, 1): the first entry whose cumulative weight exceeds ``uniform * total``.

    Z blocks of Y = ``_BLOCK`` entries are summed first and only the chosen block is scanned;
    a cumulative sum over the whole vocabulary is a sequential pass slower than all the others.
    Targets are kept strictly under the totals, so the entry found always has nonzero weight.
    """
    rows, width = weights_BV.shape
    if width % _BLOCK:
        weights_BV = torch.nn.functional.pad(weights_BV, (0, -width % _BLOCK))
    blocks_BZY = weights_BV.view(rows, -1, _BLOCK)
    cdf_BZ = blocks_BZY.sum(dim=-1).cumsum(dim=-1)
    target_B1 = _below(uniform_B[:, None].to(cdf_BZ) * cdf_BZ[:, -1:], cdf_BZ[:, -1:])
    block_B = torch.searchsorted(cdf_BZ, target_B1, right=True)[:, 0]
    before_B1 = torch.nn.functional.pad(cdf_BZ, (1, 0)).gather(-1, block_B[:, None])
    cdf_BY = blocks_BZY[torch.arange(rows, device=block_B.device), block_B].cumsum(dim=-1)
    within_B1 = _below(target_B1 - before_B1, cdf_BY[:, -1:])
    return block_B * _BLOCK + torch.searchsorted(cdf_BY, within_B1, right=True)[:, 0]


def _truncated(weights_BV: torch.Tensor, top_k: int, min_p: float) -> torch.Tensor:
    """A copy of ``weights_BV`` (each row's largest entry 1, as ``exp(x - max)`` makes it)
    with the tokens outside the ``top_k`` most likely, or under ``min_p`` of the most likely
    one's weight, zeroed (0 = off; tokens tied with the k-th are kept)."""
    kept_BV = weights_BV.clone()
    if min_p:
        kept_BV[weights_BV < min_p] = 0.0
    if top_k and top_k < weights_BV.shape[-1]:
        kept_BV[weights_BV < weights_BV.topk(top_k, dim=-1).values[:, -1:]] = 0.0
    return kept_BV


def processed_logits(logits_BV: torch.Tensor, params: SamplingParams, output_BT: torch.Tensor,
                     prompt_seen_BV: Optional[torch.Tensor], end_ids: torch.Tensor) -> torch.Tensor:
    """The logits a token is drawn from after ``params``' ``logit_bias``, ``min_tokens`` and
    penalties (vLLM's order), changed in place; ``output_BT`` holds the tokens each row drew so
    far and ``prompt_seen_BV`` which tokens its prompt holds (needed for ``repetition_penalty``
    only). ``end_ids`` are the tokens that would end the completion.

    >>> p = SamplingParams(presence_penalty=1.0, frequency_penalty=0.5, logit_bias=((0, 2.0),))
    >>> processed_logits(torch.zeros(1, 3), p, torch.tensor([[1, 1]]), None, torch.tensor([2])).tolist()
    [[2.0, -2.0, 0.0]]
    """
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias)
        logits_BV[:, list(ids)] += torch.tensor(biases, device=logits_BV.device)
    if output_BT.shape[1] < params.min_tokens and len(end_ids):
        logits_BV[:, end_ids] = float("-inf")
    penalised = params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0
    if not penalised or (not output_BT.shape[1] and prompt_seen_BV is None):
        return logits_BV
    counts_BV = torch.zeros_like(logits_BV).scatter_add_(1, output_BT, torch.ones_like(output_BT, dtype=logits_BV.dtype))
    if params.repetition_penalty != 1.0:
        seen_BV = counts_BV > 0 if prompt_seen_BV is None else (counts_BV > 0) | prompt_seen_BV
        penalty = params.repetition_penalty
        logits_BV = torch.where(seen_BV, torch.where(logits_BV > 0, logits_BV / penalty, logits_BV * penalty),
                                logits_BV)
    return logits_BV.sub_(params.frequency_penalty * counts_BV + params.presence_penalty * (counts_BV > 0))


def _holds(ids_PT: torch.Tensor, mask_PT: torch.Tensor, width: int) -> torch.Tensor:
    """Which of ``width`` vocabulary entries each (padded) row of ``ids_PT`` holds where ``mask_PT`` is 1."""
    return torch.zeros(len(ids_PT), width, dtype=torch.long, device=ids_PT.device).scatter_add_(1, ids_PT, mask_PT) > 0


def pick_tokens(logits_BV: torch.Tensor, params: SamplingParams, generator: Optional[torch.Generator],
                uniform_B: Optional[torch.Tensor] = None, alternatives: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor, Optional[tuple[torch.Tensor, torch.Tensor]]]:
    """``(next_B, logprob_B, top)``: a token per row and its log-probability under the
    temperature-scaled distribution (greedy: the untempered one), computed as log-softmax
    computes it (``x - max - log(sum(exp(x - max)))``), and with ``alternatives`` the N most
    likely tokens' ``(ids_BN, logprobs_BN)`` by the same arithmetic (so a sampled token among
    them has the same number twice; None without). The uniform numbers that pick the tokens
    are ``uniform_B`` when given, else drawn from ``generator``."""
    if params.greedy:  # the same arithmetic: logsumexp's own kernel rounds otherwise on some CPUs (3e-6 on AVX2)
        next_B, max_B1 = logits_BV.argmax(dim=-1), logits_BV.amax(dim=-1, keepdim=True)
        log_sum_B1 = torch.sub(logits_BV, max_B1).exp_().sum(dim=-1, keepdim=True).log()
        picked_B1 = logits_BV.gather(-1, next_B[:, None])
        return next_B, (picked_B1 - max_B1 - log_sum_B1)[:, 0], _top(logits_BV, alternatives, max_B1, log_sum_B1)
    if params.temperature != 1.0:
        logits_BV = logits_BV / params.temperature
    max_B1 = logits_BV.amax(dim=-1, keepdim=True)
    weights_BV = torch.sub(logits_BV, max_B1).exp_()  # probabilities times the row's sum
    sum_B1 = weights_BV.sum(dim=-1, keepdim=True)
    if uniform_B is None:
        uniform_B = torch.rand(len(logits_BV), generator=generator, device=generator.device if generator else "cpu")
    draw_BV, total_B1 = weights_BV, sum_B1
    if params.top_k or params.min_p:
        draw_BV = _truncated(weights_BV, params.top_k, params.min_p)
        total_B1 = draw_BV.sum(dim=-1, keepdim=True)
    if params.top_p < 1.0:
        kept_BE, order_BE = _top_p_filter(draw_BV.div_(total_B1), params.top_p)
        next_B = order_BE.gather(-1, _inverse_cdf(kept_BE, uniform_B)[:, None])[:, 0]
    else:
        next_B = _inverse_cdf(draw_BV, uniform_B)
    picked_B1 = logits_BV.gather(-1, next_B[:, None])
    return next_B, (picked_B1 - max_B1 - sum_B1.log())[:, 0], _top(logits_BV, alternatives, max_B1, sum_B1.log())


def _top(scaled_BV: torch.Tensor, count: int, *shifts_B1: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The ``count`` largest entries of each row, ``(ids_BN, values_BN)``, with ``shifts_B1``
    subtracted in order, as :func:`pick_tokens` subtracts them from the sampled token's."""
    if not count:
        return None
    top = scaled_BV.topk(min(count, scaled_BV.shape[-1]), dim=-1)
    values_BN = top.values
    for shift_B1 in shifts_B1:
        values_BN = values_BN - shift_B1
    return top.indices, values_BN


def continue_histories(history_B: torch.Tensor, next_B: torch.Tensor, share: bool
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cache rows of the next decoding step, after each live row (following history
    ``history_B``, a cache row) drew ``next_B``: ``(source_U, token_U, history_B)``, where
    new cache row ``u`` continues old row ``source_U[u]`` with ``token_U[u]`` and each live row
    now follows ``history_B``.

    With ``share``, rows that followed one history and drew the same token still follow one
    (their next distributions are the same computation); without, every row gets its own. A
    continuation keeps its source's cache row where it can, and the others take the rows that
    ended or follow on from the last, so that few rows are copied.

    >>> [t.tolist() for t in continue_histories(torch.tensor([0, 0, 0, 1]), torch.tensor([7, 5, 7, 5]), True)]
    [[0, 1, 0], [5, 5, 7], [2, 0, 2, 1]]
    >>> [t.tolist() for t in continue_histories(torch.tensor([0, 2, 3]), torch.tensor([4, 4, 4]), False)]
    [[0, 3, 2], [4, 4, 4], [0, 2, 1]]
    """
    if share:
        base = int(next_B.max()) + 1
        pairs_L, of_B = torch.unique(history_B * base + next_B, return_inverse=True)
        parent_L, token_L = pairs_L // base, pairs_L % base
    else:
        parent_L, token_L, of_B = history_B, next_B, torch.arange(len(history_B), device=history_B.device)
    count = len(parent_L)
    slot_L = [-1] * count
    kept = set()
    for k, parent in enumerate(parent_L.tolist()):
        if parent < count and parent not in kept:
            slot_L[k] = parent
            kept.add(parent)
    free = iter(slot for slot in range(count) if slot not in kept)
    slot_L = torch.tensor([slot if slot >= 0 else next(free) for slot in slot_L], device=history_B.device)
    source_U, token_U = torch.empty_like(parent_L), torch.empty_like(token_L)
    source_U[slot_L], token_U[slot_L] = parent_L, token_L
    return source_U, token_U, slot_L[of_B]


def token_versions(length: int, version: int, switched: list[tuple[int, int]]) -> list[int]:
    """The version that drew each of ``length`` tokens decoded from ``version`` on, with
    ``switched``'s ``(step, version)`` updates; empty when there was none (every token is
    ``version``'s).

    >>> token_versions(5, 3, [(2, 4), (4, 6)]), token_versions(2, 3, [(2, 4)]), token_versions(2, 3, [])
    ([3, 3, 4, 4, 6], [3, 3], [])
    """
    if not switched:
        return []
    versions = [version] * length
    for step, new in switched:
        versions[step:] = [new] * max(length - step, 0)
    return versions


def rows_in_cache(model, positions: int, most: int, budget_bytes: int) -> int:
    """How many rows of ``positions`` each (prompt and room for the completion) a batch takes:
    ``most``, or fewer where their key/value cache would pass ``budget_bytes`` (at least one).

    >>> from tempering.models.tiny import build_model
    >>> model = build_model(64, 64, layers=2, heads=4, max_positions=8192, seed=0, pad_token_id=0,
    ...                     bos_token_id=1, eos_token_id=2)  # 1,024 bytes of cache a position
    >>> rows_in_cache(model, 4096, 256, 64 << 20), rows_in_cache(model, 64, 256, 64 << 20)
    (16, 256)
    """
    _, kv_heads, head_dim = attention_shape(model.config)
    per_position = 2 * model.config.num_hidden_layers * kv_heads * head_dim * next(model.parameters()).element_size()
    return max(1, min(most, budget_bytes // max(1, per_position * positions)))


class HFGenerator:
    """Samples completions from ``model`` (a :class:`~tempering.rollout.base.Generator`); one
    instance per policy copy."""

    def __init__(self, model, tokenizer, chat_template: Optional[bool] = None, batch_size: int = 256,
                 bf16: bool = False, fast: bool = True, share: bool = True, onednn: bool | str = "auto"):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.bf16 = bf16
        self.share = share  # rows with the same tokens so far are decoded as one (continue_histories)
        # decoding steps without transformers' modules where that computes the same (fast_llama)
        self.fast = fast and fused_llama_supported(model)
        # the decoder's float32 products by oneDNN where onednn says so (fast_llama.wants_onednn)
        self.onednn = self.fast and fast_llama.wants_onednn(model, onednn)
        self._decoder = fast_llama.LlamaDecoder(model, self.onednn) if self.fast else None
        self.chat_template = use_chat_template(tokenizer, chat_template)
        self.eos_ids = self._eos_ids()
        forward = unwrapped(model).forward  # the arguments an adapted model passes on
        self._cache_arg = cache_argument(forward)
        self._keep_arg = logits_to_keep_argument(forward)
        self.updates: Optional[Callable[[], Optional[int]]] = None
        """Asked between decoding steps: loads new weights into the model and returns their
        version, or None when none came (partial rollouts; None: weights stay for the call)."""

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        config_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
        return {i for i in ids if i is not None}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """New policy weights into the model this generator samples from (none: it shares them)."""
        if weights:
            self.model.load_state_dict(weights, strict=False)

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.chat_template)

    def generate(
        self,
        problems: list[Problem],
        group_size: int,
        params: SamplingParams,
        policy_version: int = 0,
        generator: Optional[torch.Generator] = None,
    ) -> list[Group]:
        """``group_size`` completions for each problem, in problem order."""
        limit = prompt_limit(self.model.config, params.max_prompt_tokens, params.max_new_tokens)
        prompts = [fit_prompt(self.encode_prompt(p.prompt), p, limit, params.long_prompts) for p in problems]
        flat = [(i, prompts[i]) for i in range(len(problems)) for _ in range(group_size)]
        longest = max((len(ids) for ids in prompts), default=0) + params.max_new_tokens
        rows = rows_in_cache(self.model, longest, self.batch_size, CACHE_BUDGET_BYTES)
        rollouts: list[Rollout] = []
        for start in range(0, len(flat), rows):
            chunk = flat[start : start + rows]
            switched: list[tuple[int, int]] = []
            outputs = self.sample_with_alternatives([ids for _, ids in chunk], params, generator,
                                                    switched=switched)[0]
            for (i, prompt_ids), (completion, logprobs, reason) in zip(chunk, outputs):
                rollouts.append(Rollout(
                    problem=problems[i], prompt_ids=prompt_ids, completion_ids=completion,
                    logprobs=logprobs, finish_reason=reason, policy_version=policy_version,
                    text=self.tokenizer.decode(completion, skip_special_tokens=True),
                    versions=token_versions(len(completion), policy_version, switched),
                ))
            policy_version = switched[-1][1] if switched else policy_version
        return [Group(p, rollouts[i * group_size : (i + 1) * group_size]) for i, p in enumerate(problems)]

    def _new_cache(self, capacity: int, dtype: Optional[torch.dtype]):
        """A cache with preallocated layers where the model's layers are plain full attention;
        otherwise None, and the model makes its own."""
        return preallocated_cache(self.model.config, capacity, dtype)

    def _forward(self, ids_BT, mask_BT, positions_BT, cache):
        keep = {self._keep_arg: 1} if self._keep_arg else {}
        out = self.model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=positions_BT,
                         use_cache=True, **{self._cache_arg: cache}, **keep)
        return out.logits[:, -1, :].float(), out[self._cache_arg]

    @property
    def context_length(self) -> int:
        """Positions the model attends over (0 = it states none)."""
        return getattr(self.model.config, "max_position_embeddings", None) or 0

    def sample(self, prompts: list[list[int]], params: SamplingParams,
               generator: Optional[torch.Generator | RowStreams] = None) -> list[tuple[list[int], list[float], str]]:
        """``(completion ids, log-probs, finish reason)`` after each prompt, given as token ids
        (repeats welcome: a repeated prompt is prefilled once); the finish reason is "stop"
        (end-of-sequence, a stop token or a stop string) or "length". Multi-turn episodes
        (``tempering.envs.runner``) continue their token histories through this. Draws come
        from ``generator``, or with :class:`RowStreams` from each row's own stream."""
        return self.sample_with_alternatives(prompts, params, generator)[0]

    @torch.no_grad()
    def sample_with_alternatives(self, prompts: list[list[int]], params: SamplingParams,
                                 generator: Optional[torch.Generator | RowStreams] = None, alternatives: int = 0,
                                 on_step: Optional[StepHook] = None,
                                 switched: Optional[list[tuple[int, int]]] = None
                                 ) -> tuple[list[tuple[list[int], list[float], str]], list[list[list[tuple[int, float]]]]]:
        """What :meth:`sample` gives, and for each row, per sampled token, the ``alternatives``
        most likely ``(token id, log-prob)`` under the distribution it was drawn from (what
        ``temper serve`` answers for ``logprobs: N``); empty lists when ``alternatives`` is 0.

        ``on_step(row_B, next_B, logprob_B, top, done_B)`` hears of every decoding step as it is
        drawn (the rows still running, their tokens, log-probs, :func:`pick_tokens`'
        alternatives, and which rows the token ended):
        ``temper serve`` streams from it. It may return row indices to end at once (a request
        whose client has gone), which then end there (what they drew is not worth keeping).

        ``switched`` receives ``(step, version)`` for each update ``updates`` made during the
        call: the tokens from decoding step ``step`` on were drawn under ``version``."""
        device = self.model.device
        index_of = {ids: i for i, ids in enumerate(dict.fromkeys(map(tuple, prompts)))}
        distinct = list(index_of)
        prompt_of_row_B = torch.tensor([index_of[tuple(p)] for p in prompts], device=device)
        ids_PT, mask_PT, positions_PT = self._left_padded(distinct)
        width = ids_PT.shape[1]

        n, limit = len(prompts), params.max_new_tokens
        tokens_BT = torch.zeros(n, limit, dtype=torch.long, device=device)
        logprobs_BT = torch.zeros(n, limit, device=device)
        top_ids_BTN = torch.zeros(n, limit, alternatives, dtype=torch.long, device=device)
        top_logprobs_BTN = torch.zeros(n, limit, alternatives, device=device)
        lengths_B = torch.full((n,), limit, device=device)
        stopped_B = torch.zeros(n, dtype=torch.bool, device=device)
        end_ids = sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids))
        end_ids = torch.tensor(end_ids, dtype=torch.long, device=device)
        processed = params != replace(params, **_UNPROCESSED)
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()
        decoder = self._decoder if self.fast and limit > 1 else None
        with autocast:  # one context for the whole loop, so weights are cast to bf16 once
            # the decoder keeps its own float32 cache; transformers' path a bf16 one under bf16
            cache = self._new_cache(width if decoder else width + limit,
                                    torch.bfloat16 if self.bf16 and not decoder else None)
            logits_UV, cache = self._forward(ids_PT, mask_PT, positions_PT, cache)
            prompt_seen_PV = _holds(ids_PT, mask_PT, logits_UV.shape[-1]) if params.repetition_penalty != 1.0 else None
            if decoder:
                decoder.start(cache, width + limit, torch.bfloat16 if self.bf16 else None, rows=n)
            # histories: the distinct token sequences decoded so far, one cache row each (at
            # first, the distinct prompts); every running row follows one
            mask_UT, position_U = mask_PT, positions_PT[:, -1]
            history_B, row_B = prompt_of_row_B, torch.arange(n, device=device)
            for step in range(limit):
                logits_BV = logits_UV[history_B]
                if processed:
                    seen_BV = None if prompt_seen_PV is None else prompt_seen_PV[prompt_of_row_B[row_B]]
                    logits_BV = processed_logits(logits_BV, params, tokens_BT[row_B, :step], seen_BV, end_ids)
                streams = isinstance(generator, RowStreams) and not params.greedy
                uniform_B = generator.uniform(row_B) if streams else None
                next_B, logprob_B, top = pick_tokens(logits_BV, params, None if streams else generator, uniform_B,
                                                     alternatives)
                tokens_BT[row_B, step], logprobs_BT[row_B, step] = next_B, logprob_B
                if top is not None:
                    top_ids_BTN[row_B, step], top_logprobs_BTN[row_B, step] = top
                done_B = torch.isin(next_B, end_ids)
                if params.stop and step + 1 >= params.min_tokens:
                    done_B |= self._stop_string_ends(tokens_BT[row_B, : step + 1], params.stop)
                if on_step is not None and (dropped := on_step(row_B, next_B, logprob_B, top, done_B)) is not None:
                    done_B |= torch.isin(row_B, dropped.to(device))
                lengths_B[row_B[done_B]] = step + 1
                stopped_B[row_B[done_B]] = True
                if step == limit - 1 or bool(done_B.all()):
                    break
                live_B = (~done_B).nonzero()[:, 0]
                row_B, history_B, next_B = row_B[live_B], history_B[live_B], next_B[live_B]
                source_U, token_U, history_B = continue_histories(history_B, next_B, self.share)
                if len(source_U) != len(mask_UT) or bool((source_U != torch.arange(len(source_U), device=device)).any()):
                    if decoder:  # some history ended, moved or split
                        decoder.select_rows(source_U)
                    else:
                        select_cache_rows(cache, source_U)
                mask_UT = torch.nn.functional.pad(mask_UT[source_U], (0, 1), value=1)
                position_U = position_U[source_U] + 1
                version = self.updates() if self.updates is not None else None
                if version is not None:
                    if switched is not None:
                        switched.append((step + 1, version))
                    histories = self._histories(distinct, prompt_of_row_B, row_B, history_B, tokens_BT[:, : step + 1])
                    logits_UV, cache, mask_UT, position_U = self._prefill(histories, decoder, limit - step - 1, n)
                elif decoder:
                    logits_UV = decoder.step(token_U, position_U, mask_UT)
                else:
                    logits_UV, cache = self._forward(token_U[:, None], mask_UT, position_U[:, None], cache)
        tokens, logprobs = tokens_BT.tolist(), logprobs_BT.tolist()
        lengths = lengths_B.tolist()
        outputs = [(tokens[b][:length], logprobs[b][:length], "stop" if stopped else "length")
                   for b, (length, stopped) in enumerate(zip(lengths, stopped_B.tolist()))]
        top_ids, top_logprobs = top_ids_BTN.tolist(), top_logprobs_BTN.tolist()
        tops = [[list(zip(top_ids[b][t], top_logprobs[b][t])) for t in range(length)] if alternatives else []
                for b, length in enumerate(lengths)]
        return outputs, tops

    @staticmethod
    def _histories(distinct: list[tuple[int, ...]], prompt_of_row_B: torch.Tensor, row_B: torch.Tensor,
                   history_B: torch.Tensor, tokens_BT: torch.Tensor) -> list[list[int]]:
        """Each cache row's tokens: its prompt and what was drawn after it (``tokens_BT``, by
        row), from the first live row that follows it (all that follow it drew the same)."""
        first_U = torch.full((int(history_B.max()) + 1,), len(prompt_of_row_B), device=row_B.device)
        first_U = first_U.scatter_reduce_(0, history_B, row_B, "amin").tolist()
        drawn = tokens_BT[first_U].tolist()
        return [list(distinct[prompt]) + tokens for prompt, tokens in zip(prompt_of_row_B[first_U].tolist(), drawn)]

    def _prefill(self, histories: list[list[int]], decoder: Optional[fast_llama.LlamaDecoder], room: int,
                 rows: int) -> tuple[torch.Tensor, object, torch.Tensor, torch.Tensor]:
        """``(logits_UV, cache, mask_UT, position_U)`` of ``histories`` (left-padded, at their
        own positions) under the model's weights now, with cache room for ``room`` more tokens
        and, in the decoder, ``rows`` rows: the state decoding goes on from after new weights."""
        ids_UT, mask_UT, positions_UT = self._left_padded(histories)
        width = ids_UT.shape[1]
        dtype = torch.bfloat16 if self.bf16 else None
        cache = self._new_cache(width if decoder else width + room, None if decoder else dtype)
        logits_UV, cache = self._forward(ids_UT, mask_UT, positions_UT, cache)
        if decoder:
            decoder.start(cache, width + room, dtype, rows=rows)
        return logits_UV, cache, mask_UT, positions_UT[:, -1]

    def _left_padded(self, rows: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(ids_UT, mask_UT, positions_UT)`` of token sequences left-padded to the longest,
        each counting positions from 0 at its first token."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(map(len, rows))
        ids_UT = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], device=self.model.device)
        mask_UT = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.model.device)
        return ids_UT, mask_UT, (mask_UT.cumsum(-1) - 1).clamp(min=0)

    def _stop_string_ends(self, tokens_BT: torch.Tensor, stop: tuple[str, ...]) -> torch.Tensor:
        """Rows whose newest token completed one of the ``stop`` strings."""
        # Every token decodes to at least one character, so the last L tokens hold any stop
        # string of length <= L that the newest token completed.
        tails = self.tokenizer.batch_decode(tokens_BT[:, -max(map(len, stop)):].tolist(), skip_special_tokens=True)
        return torch.tensor([any(s in tail for s in stop) for tail in tails], device=tokens_BT.device)
