"""The sampler's queue behind ``temper serve`` (:mod:`tempering.rollout.server`): requests
become jobs, and one thread runs them through the sampler, gathering concurrent jobs with the
same settings into one call.

Each row (a prompt's sample) draws from a random stream of its own, seeded as vLLM seeds a
request's parts: every prompt of a request with ``seed`` S is sampled as though sent alone
with S, and its ``n`` samples get S, S+1, ... (vLLM's per-sample seeds), so what a request
gets does not depend on what it was batched with or which prompts came with it.

A streamed job hears of every decoding step as it is drawn (``Job.events``); a job whose
client hung up is dropped: left out of the next call if it is still queued, its rows ended
at the next step if it is being sampled (:func:`tempering.httpd.client_gone`).
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from tempering.httpd import ClientGone, client_gone
from tempering.models.loading import load_checked, read_weights
from tempering.models.lora import adapters_off, is_adapted, serve_adapter
from tempering.rollout.base import RowStreams, SamplingParams
from tempering.rollout.hf import HFGenerator
from tempering.rollout.openai_api import RequestError, Sampled

POLL_S = 0.05
"""How often a waiting request looks at its connection for a client that hung up."""

Step = list[tuple[int, int, float, list[tuple[int, float]], bool]]
"""One decoding step of a streamed job: ``(row, token id, log-prob, alternatives, whether it
ended the row)`` of each row that drew."""


@dataclass(frozen=True)
class Limits:
    """What the server takes on, in token positions (a row's prompt plus its ``max_tokens``)."""

    request_tokens: int = 1 << 18
    """Positions one request may ask for; more is a 400 (``--max-request-tokens``)."""
    queued_tokens: int = 1 << 21
    """Positions waiting or being sampled, all requests together; more is a 429 (``--max-queued-tokens``)."""


@dataclass(eq=False)
class Job:
    """One request's rows (each prompt ``n`` times, in order), waiting for the sampler."""

    rows: list[list[int]]
    params: SamplingParams
    seeds: list[int]
    """Each row's seed: its random stream's."""
    prompt_tokens: int
    done: threading.Event = field(default_factory=threading.Event)
    outputs: Optional[list[tuple[list[int], list[float], str]]] = None
    alternatives: list[list[list[tuple[int, float]]]] = field(default_factory=list)
    """Per row, per token, the most likely ``(id, log-prob)``: ``top`` of them."""
    top: int = 0
    error: Optional[BaseException] = None
    version: int = 0
    adapter: Optional[str] = None
    """The LoRA adapter to sample with; None = the base model."""
    events: Optional[queue.Queue] = None
    """For a streamed request: a :data:`Step` put here after each decoding step (the built-in
    sampler's; another sampler's tokens come only with ``outputs``), all of them before ``done``."""
    cancelled: bool = False
    """Its client hung up: what is left of it is not sampled."""

    def joins(self, other: "Job") -> bool:
        """Whether this job can share a sampler call with ``other``."""
        return self.params == other.params and self.adapter == other.adapter

    @property
    def positions(self) -> int:
        return sum(len(row) + self.params.max_new_tokens for row in self.rows)

    def sampled(self) -> list[Sampled]:
        """The rows as sampled (no alternatives, where none were asked for, but one empty list a token)."""
        alternatives = self.alternatives or [[[] for _ in ids] for ids, _, _ in self.outputs]
        return [Sampled(row, ids, logprobs, reason, alts) for row, (ids, logprobs, reason), alts
                in zip(self.rows, self.outputs, alternatives)]


class Batcher:
    """Runs jobs through the sampler on one thread, gathering those waiting with the same
    settings into one call (at most ``max_rows`` rows, waiting ``gather_s`` for company)."""

    def __init__(self, sampler: HFGenerator, max_rows: int, gather_s: float = 0.01, limits: Limits = Limits()):
        self.sampler, self.max_rows, self.gather_s, self.limits = sampler, max_rows, gather_s, limits
        self.version = 0
        self.tokens_drawn = 0  # tokens the built-in sampler drew, all jobs together
        self.lock = threading.Lock()  # held while sampling or loading weights
        self._queue: queue.Queue[Job] = queue.Queue()
        self._held: list[Job] = []  # taken from the queue, waiting for a call with their settings
        self._queued = 0  # positions of the jobs submitted and not yet finished
        self._count_lock = threading.Lock()
        threading.Thread(target=self._run, name="sampler", daemon=True).start()

    @property
    def queued(self) -> int:
        """Token positions of the jobs submitted and not yet finished (what --max-queued-tokens bounds)."""
        return self._queued

    def submit(self, job: Job) -> Job:
        """``job`` queued for the sampler (:meth:`wait` for it); a RequestError (429) when the
        queue holds too much already."""
        size = job.positions
        with self._count_lock:
            if self._queued + size > self.limits.queued_tokens:
                raise RequestError(f"the server is busy: {self._queued} token positions are queued and this "
                                   f"request adds {size}, over its limit of {self.limits.queued_tokens} "
                                   "(temper serve --max-queued-tokens); retry later", 429)
            self._queued += size
        self._queue.put(job)
        return job

    def wait(self, job: Job) -> Job:
        """``job`` once sampled; ClientGone (and the job dropped) when the client of the
        request this thread answers hangs up first."""
        while not job.done.wait(POLL_S):
            if client_gone():
                job.cancelled = True
                raise ClientGone()
        if job.error is not None:
            raise job.error
        return job

    def _finish(self, job: Job) -> None:
        """``job`` answered (or dropped): its positions leave the queue's count."""
        with self._count_lock:
            self._queued -= job.positions
        job.done.set()

    def _take(self, job: Job) -> bool:
        """Whether ``job`` is still wanted; one whose client left is finished here, unsampled."""
        if job.cancelled:
            self._finish(job)
        return not job.cancelled

    def _next_batch(self) -> list[Job]:
        first = None
        while first is None or not self._take(first):
            first = self._held.pop(0) if self._held else self._queue.get()
        batch, rows = [first], len(first.rows)
        for job in list(self._held):
            if job.joins(first) and rows + len(job.rows) <= self.max_rows:
                self._held.remove(job)
                if self._take(job):
                    batch.append(job)
                    rows += len(job.rows)
        deadline = time.monotonic() + self.gather_s
        while rows < self.max_rows:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if not self._take(job):
                continue
            if job.joins(first) and rows + len(job.rows) <= self.max_rows:
                batch.append(job)
                rows += len(job.rows)
            else:
                self._held.append(job)
        return batch

    def _sample(self, batch: list[Job]) -> tuple[list, list]:
        """The batch's outputs and alternatives (one list per row), ``max_rows`` rows a sampler
        call (only a job larger than that alone takes several); each row draws from its own stream.

        The sampler is the built-in one (``temper serve``'s) or, for an agent's calls, any
        :class:`~tempering.rollout.base.TokenSampler` a run samples with; only the built-in one
        gives alternatives (a job asking for them reaches no other: ``tempering.envs.recording``)
        and streams or drops rows step by step."""
        rows = [ids for job in batch for ids in job.rows]
        owners = [(job, r) for job in batch for r in range(len(job.rows))]
        generators = [torch.Generator().manual_seed(seed) for job in batch for seed in job.seeds]
        top = max(job.top for job in batch)
        built_in = isinstance(self.sampler, HFGenerator)
        outputs, alternatives = [], []
        with self.lock, (nullcontext() if batch[0].adapter else adapters_off(getattr(self.sampler, "model", None))):
            for start in range(0, len(rows), self.max_rows):
                chunk, of_row = rows[start : start + self.max_rows], owners[start : start + self.max_rows]
                streams = RowStreams(generators[start : start + self.max_rows], list(range(len(chunk))))
                if all(job.cancelled for job, _ in of_row):
                    done, alts = [([], [], "length") for _ in chunk], [[] for _ in chunk]
                elif built_in:
                    done, alts = self.sampler.sample_with_alternatives(chunk, batch[0].params, streams, top,
                                                                       self._step_hook(of_row))
                else:
                    done, alts = self.sampler.sample(chunk, batch[0].params, streams), [[] for _ in chunk]
                outputs += done
                alternatives += alts
            version = self.version
        for job in batch:
            job.version = version
        return outputs, alternatives

    def _step_hook(self, of_row: list[tuple[Job, int]]):
        """The sampler's per-step hook for a call whose row ``b`` is row ``of_row[b][1]`` of job
        ``of_row[b][0]``: counts the tokens drawn, hands streamed jobs their step, and ends the
        rows of jobs whose clients left."""
        rows_of: dict[Job, list[int]] = {}
        for b, (job, _) in enumerate(of_row):
            rows_of.setdefault(job, []).append(b)
        jobs = list(rows_of)
        streamed = [job for job in jobs if job.events is not None]

        def on_step(row_B: torch.Tensor, next_B: torch.Tensor, logprob_B: torch.Tensor, top,
                    done_B: torch.Tensor) -> Optional[torch.Tensor]:
            self.tokens_drawn += len(row_B)
            if streamed:
                drawn = zip(row_B.tolist(), next_B.tolist(), logprob_B.tolist(),
                            [list(zip(*pair)) for pair in zip(*(t.tolist() for t in top))] if top else
                            [[] for _ in range(len(row_B))], done_B.tolist())
                steps: dict[Job, Step] = {job: [] for job in streamed}
                for b, token, logprob, alts, ended in drawn:
                    job, r = of_row[b]
                    if job in steps:
                        steps[job].append((r, token, logprob, alts, ended))
                for job, step in steps.items():
                    if step:
                        job.events.put(step)
            gone = [b for job in jobs if job.cancelled for b in rows_of[job]]
            return torch.tensor(gone, dtype=torch.long) if gone else None

        return on_step

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            try:
                outputs, alternatives = self._sample(batch)
            except Exception as exc:  # every waiting request hears of it
                traceback.print_exc()
                for job in batch:
                    job.error = exc
                    self._finish(job)
                continue
            start = 0
            for job in batch:
                job.outputs = outputs[start : start + len(job.rows)]
                job.alternatives = alternatives[start : start + len(job.rows)] if job.top else []
                start += len(job.rows)
                self._finish(job)

    @torch.no_grad()
    def prompt_logprobs(self, prompts: list[list[int]], top: int, adapter: Optional[str]
                        ) -> list[tuple[list[Optional[float]], list[Optional[list[tuple[int, float]]]]]]:
        """Per prompt, each token's log-prob given the tokens before it (the first's is None)
        and the ``top`` most likely tokens there, under the model's own distribution; one
        prompt a forward pass, so no more than one prompt's logits exist at once."""
        answers = []
        with self.lock, (nullcontext() if adapter else adapters_off(self.sampler.model)):
            model = self.sampler.model
            for ids in prompts:
                logits_TV = model(input_ids=torch.tensor([ids], device=model.device), use_cache=False).logits[0, :-1]
                scores_TV = logits_TV.float().log_softmax(dim=-1)
                chosen = scores_TV.gather(-1, torch.tensor(ids[1:], device=scores_TV.device)[:, None])[:, 0].tolist()
                best = scores_TV.topk(max(1, top), dim=-1)
                alternatives = [list(zip(i, v)) for i, v in zip(best.indices.tolist(), best.values.tolist())]
                answers.append(([None, *chosen], [None, *alternatives]))
        return answers

    def reload(self, folder: str, version: Optional[int]) -> int:
        """Load the weights saved in ``folder``; return the new policy version."""
        if not Path(folder).is_dir():
            raise RequestError(f"model_path {folder!r} is not a folder on the server", param="model_path")
        try:
            weights = read_weights(Path(folder))
        except (FileNotFoundError, RuntimeError) as exc:
            raise RequestError(f"model_path {folder!r}: {exc}", param="model_path") from None
        return self.swap(weights, version, f"model_path {folder!r}", "model_path")

    def swap(self, weights: dict[str, torch.Tensor], version: Optional[int], source: str,
             param: Optional[str] = None) -> int:
        """Serve ``weights`` (read whole beforehand, off to the side) from the next sampler call
        on: they are checked against the model, then copied in while no call runs, so a call sees
        the old weights or the new, never a mix; the new policy version. ``source`` names them in
        an error (a 400 on the request's ``param``), which leaves the model as it was."""
        with self.lock:
            if is_adapted(self.sampler.model):
                raise RequestError("a LoRA adapter is loaded on this server: it takes new adapters "
                                   "(/v1/load_lora_adapter), not full weights; restart it to serve other weights")
            try:
                load_checked(self.sampler.model, weights, source)
            except RuntimeError as exc:
                raise RequestError(str(exc), param=param) from None
            return self._advance(version)

    def load_adapter(self, name: str, folder: str, version: Optional[int]) -> int:
        """Serve the peft adapter saved in ``folder`` as ``name`` (in place of any other);
        return the new policy version."""
        if not Path(folder).is_dir():
            raise RequestError(f"lora_path {folder!r} is not a folder on the server", param="lora_path")
        with self.lock:
            try:
                model = serve_adapter(self.sampler.model, Path(folder), name)
            except (FileNotFoundError, ValueError, RuntimeError) as exc:
                raise RequestError(f"lora_path {folder!r}: {exc}", param="lora_path") from None
            if model is not self.sampler.model:  # first adapter: sample through the wrapper
                s = self.sampler
                self.sampler = HFGenerator(model, s.tokenizer, s.chat_template, s.batch_size, s.bf16, share=s.share)
            return self._advance(version)

    def _advance(self, version: Optional[int]) -> int:
        """The policy version after new weights: the next one, or ``version`` when the client names it."""
        self.version = self.version + 1 if version is None else version
        return self.version


