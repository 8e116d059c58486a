"""``temper serve``: an OpenAI-compatible completions server over tempering's own sampler.

It exists so that the server path of training (``tempering.rollout.remote``) runs end
to end on a CPU, for ``temper eval`` and lm-evaluation-harness against a served model, and for
users without a GPU inference engine. It answers as vLLM's OpenAI server does, so one client
reads both (the fields and answers: ``tempering.rollout.openai_api``):

- ``POST /v1/completions``: ``prompt`` as text, token ids, or a list of either; ``n``,
  ``max_tokens``, ``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``min_p``, the
  penalties, ``logit_bias``, ``stop``, ``stop_token_ids``, ``min_tokens``, ``ignore_eos``,
  ``seed``, ``logprobs: N`` (at most 20), ``echo`` (with ``max_tokens: 0``, the prompt's
  log-probs alone), ``stream``. Every choice carries ``token_ids`` (the exact ids sampled, as
  vLLM's ``return_token_ids``) and, with ``logprobs``, ``logprobs.tokens`` (``"token_id:N"``
  with ``return_tokens_as_token_ids``, else the tokens' text), ``logprobs.token_logprobs``
  (the sampled tokens' log-probs under the temperature-scaled distribution, what the learner
  recomputes: vLLM's ``--logprobs-mode processed_logprobs``) and ``logprobs.top_logprobs``.
  Choices are ordered prompt by prompt, ``n`` each.
- ``POST /v1/chat/completions``: ``messages`` (content as text or text parts) rendered with
  the chat template (``tools`` passed to it); the same options, ``logprobs: true`` and
  ``top_logprobs`` giving ``logprobs.content`` entries.
- ``GET /v1/models``: the served model, its context (``max_model_len``) and policy version.
- ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info`` (vLLM's), so that clients
  that take the tokenizer from the server (lm-evaluation-harness's ``remote`` backend) work
  offline.
- ``POST /update_weights_from_disk`` (SGLang's name): ``{"model_path": DIR}`` loads the
  ``*.safetensors`` weights in DIR (a ``save_pretrained`` folder) and moves the policy
  version on by one, or to ``"version"`` when given (so a retried reload is harmless); a
  folder that is missing or holds other weights is a 400 and leaves the served weights as
  they were. Every completion response carries the ``policy_version`` that sampled it.
- ``POST /v1/load_lora_adapter`` (vLLM's): ``{"lora_name": NAME, "lora_path": DIR}`` loads
  the peft adapter in DIR (``adapter_config.json``, ``adapter_model.safetensors``) onto the
  served model, in place of any adapter loaded before (one at a time), and moves the policy
  version on as a reload does (``"version"`` too). Requests whose ``model`` is NAME sample
  with the adapter, others with the base; ``/v1/models`` lists NAME with the base as its
  ``parent``. Once an adapter is loaded, sampling runs through transformers' modules (the
  fused decoder reads plain weights) and full reloads are refused.

Concurrent requests are gathered into one sampler call (requests with the same sampling
settings, up to ``batch_size`` rows; a larger request runs as several calls of that size):
each request draws from a random stream seeded by its own ``seed``
(:class:`~tempering.rollout.base.RowStreams`), so what a request gets does not depend on what
it was batched with. A reload waits for the sampler call in progress and never overlaps one.

Bounds (:class:`Limits`): a request's token positions (its rows, prompts times ``n``, each
prompt's length plus ``max_tokens``) are capped (400 naming the limit and its option), and so
are all the positions waiting or being sampled (429: retry later). With an ``api_key`` every
endpoint but ``/health`` wants ``Authorization: Bearer KEY`` (401 otherwise), as vLLM's
``--api-key`` does; ``temper serve`` refuses a non-loopback address without one.

Not done: a stream's chunks are sent once the whole completion is sampled (the sampler
decodes a batch, not one request token by token), so streaming gives the format, not an
earlier first token; tool-call parsing, structured output, beam search, ``suffix``,
``best_of``; several adapters at once; TLS (put a proxy in front for it).
"""

from __future__ import annotations

import hmac
import json
import queue
import random
import socket
import threading
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Callable, Optional

import torch

from tempering.models.loading import load_weights_from
from tempering.models.lora import adapters_off, is_adapted, serve_adapter
from tempering.rollout.base import RowStreams, SamplingParams
from tempering.rollout.hf import HFGenerator
from tempering.rollout.openai_api import (RequestError, Sampled, Streamed, Wire, chat_messages, completion_prompts,
                                          error_body, event_stream, flag, logprobs_asked, refuse_unsupported,
                                          sampling_request, usage)
from tempering.rollout.prompts import chat_ids, encode_prompt
from tempering.httpd import HTTPServer

MAX_BODY_BYTES = 64 << 20


@dataclass(frozen=True)
class Limits:
    """What the server takes on, in token positions (a row's prompt plus its ``max_tokens``)."""

    request_tokens: int = 1 << 18
    """Positions one request may ask for; more is a 400 (``--max-request-tokens``)."""
    queued_tokens: int = 1 << 21
    """Positions waiting or being sampled, all requests together; more is a 429 (``--max-queued-tokens``)."""


@dataclass
class Job:
    """One request's rows (each prompt ``n`` times, in order), waiting for the sampler."""

    rows: list[list[int]]
    params: SamplingParams
    seed: int
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


Sampling = Callable[[dict, list[list[int]]], Job]
"""How an endpoint samples a request's prompts: ``(body, prompts) -> Job``."""


class Batcher:
    """Runs jobs through the sampler on one thread, gathering those waiting with the same
    settings into one call (at most ``max_rows`` rows, waiting ``gather_s`` for company)."""

    def __init__(self, sampler: HFGenerator, max_rows: int, gather_s: float = 0.01, limits: Limits = Limits()):
        self.sampler, self.max_rows, self.gather_s, self.limits = sampler, max_rows, gather_s, limits
        self.version = 0
        self.lock = threading.Lock()  # held while sampling or loading weights
        self._queue: queue.Queue[Job] = queue.Queue()
        self._held: list[Job] = []  # taken from the queue, waiting for a call with their settings
        self._queued = 0  # positions of the jobs submitted and not yet answered
        self._count_lock = threading.Lock()
        threading.Thread(target=self._run, name="sampler", daemon=True).start()

    def submit(self, job: Job) -> Job:
        """``job`` sampled; a RequestError (429) when the queue holds too much already."""
        size = job.positions
        with self._count_lock:
            if self._queued + size > self.limits.queued_tokens:
                raise RequestError(f"the server is busy: {self._queued} token positions are queued and this "
                                   f"request adds {size}, over its limit of {self.limits.queued_tokens} "
                                   "(temper serve --max-queued-tokens); retry later", 429)
            self._queued += size
        try:
            self._queue.put(job)
            job.done.wait()
        finally:
            with self._count_lock:
                self._queued -= size
        if job.error is not None:
            raise job.error
        return job

    def _next_batch(self) -> list[Job]:
        first = self._held.pop(0) if self._held else self._queue.get()
        batch, rows = [first], len(first.rows)
        for job in list(self._held):
            if job.joins(first) and rows + len(job.rows) <= self.max_rows:
                self._held.remove(job)
                batch.append(job)
                rows += len(job.rows)
        deadline = time.monotonic() + self.gather_s
        while rows < self.max_rows:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job.joins(first) and rows + len(job.rows) <= self.max_rows:
                batch.append(job)
                rows += len(job.rows)
            else:
                self._held.append(job)
        return batch

    def _sample(self, batch: list[Job]) -> tuple[list, list]:
        """The batch's outputs and alternatives, ``max_rows`` rows a sampler call (only a job
        larger than that alone takes several); each job's rows draw from its own stream.

        The sampler is the built-in one (``temper serve``'s) or, for an agent's calls, any
        :class:`~tempering.rollout.base.TokenSampler` a run samples with; only the built-in one
        gives alternatives (a job asking for them reaches no other: ``tempering.envs.recording``)."""
        rows = [ids for job in batch for ids in job.rows]
        owners = [k for k, job in enumerate(batch) for _ in job.rows]
        generators = [torch.Generator().manual_seed(job.seed) for job in batch]
        top = max(job.top for job in batch)
        outputs, alternatives = [], []
        with self.lock, (nullcontext() if batch[0].adapter else adapters_off(getattr(self.sampler, "model", None))):
            for start in range(0, len(rows), self.max_rows):
                streams = RowStreams(generators, owners[start : start + self.max_rows])
                chunk = rows[start : start + self.max_rows]
                if top:
                    done, alts = self.sampler.sample_with_alternatives(chunk, batch[0].params, streams, top)
                else:
                    done, alts = self.sampler.sample(chunk, batch[0].params, streams), []
                outputs += done
                alternatives += alts
            version = self.version
        for job in batch:
            job.version = version
        return outputs, alternatives

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            try:
                outputs, alternatives = self._sample(batch)
            except Exception as exc:  # every waiting request hears of it
                traceback.print_exc()
                for job in batch:
                    job.error = exc
                    job.done.set()
                continue
            start = 0
            for job in batch:
                job.outputs = outputs[start : start + len(job.rows)]
                job.alternatives = alternatives[start : start + len(job.rows)] if job.top else []
                start += len(job.rows)
                job.done.set()

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
        with self.lock:
            if is_adapted(self.sampler.model):
                raise RequestError("a LoRA adapter is loaded on this server: it takes new adapters "
                                   "(/v1/load_lora_adapter), not full weights; restart it to serve other weights")
            try:
                load_weights_from(self.sampler.model, Path(folder))
            except (FileNotFoundError, RuntimeError) as exc:
                raise RequestError(f"model_path {folder!r}: {exc}", param="model_path") from None
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


class Server:
    """What the HTTP handlers call: request in, response body out."""

    def __init__(self, sampler: HFGenerator, name: str, batch_size: int, gather_s: float = 0.01,
                 limits: Limits = Limits()):
        self.sampler, self.name, self.limits = sampler, name, limits
        self.tokenizer = sampler.tokenizer
        self.vocab = len(self.tokenizer)
        self.batcher = Batcher(sampler, batch_size, gather_s, limits)
        self.adapter: Optional[str] = None  # the LoRA adapter's name, once one is loaded

    def models(self) -> dict:
        about = {"object": "model", "owned_by": "tempering", "created": 0,
                 "max_model_len": self.sampler.context_length, "policy_version": self.batcher.version}
        adapters = [] if self.adapter is None else [{"id": self.adapter, "parent": self.name, **about}]
        return {"object": "list", "data": [{"id": self.name, **about}, *adapters]}

    def _check_model(self, body: dict) -> None:
        if body.get("model") not in (None, self.name, self.adapter):
            raise RequestError(f"the model {body['model']!r} does not exist; this server serves "
                               f"{', '.join(repr(m['id']) for m in self.models()['data'])}", 404, "model")

    def check_prompts(self, prompts: list[list[int]]) -> None:
        if any(not p for p in prompts):
            raise RequestError("a prompt is empty", param="prompt")
        if any(not 0 <= t < self.vocab for p in prompts for t in p):
            raise RequestError(f"a prompt holds a token id outside the vocabulary (0..{self.vocab - 1})", param="prompt")

    def sample(self, body: dict, prompts: list[list[int]]) -> Job:
        """Sample ``prompts`` as ``body`` asks (the endpoints' default way of sampling)."""
        self.check_prompts(prompts)
        params, n, seed = sampling_request(body, [len(p) for p in prompts], self.sampler.context_length, self.vocab)
        adapter = self.adapter if self.adapter is not None and body.get("model") == self.adapter else None
        return self.run(prompts, params, n, seed, adapter, logprobs_asked(body, "messages" in body) or 0)

    def run(self, prompts: list[list[int]], params: SamplingParams, n: int, seed: int,
            adapter: Optional[str] = None, top: int = 0) -> Job:
        """``n`` samples of each prompt, through the batcher (with the LoRA ``adapter``, if
        named), with the ``top`` most likely alternatives of each token; a RequestError when
        the request is over :attr:`Limits.request_tokens`."""
        job = Job([p for p in prompts for _ in range(n)], params, seed, sum(map(len, prompts)), top=top,
                  adapter=adapter)
        if job.positions > self.limits.request_tokens:
            raise RequestError(f"this request asks for {job.positions} token positions ({len(prompts)} prompts x "
                               f"n={n}, each its prompt plus max_tokens={params.max_new_tokens}), over this "
                               f"server's limit of {self.limits.request_tokens} a request (temper serve "
                               "--max-request-tokens); send fewer prompts, a smaller n or max_tokens")
        if not params.max_new_tokens:  # echo alone: nothing to sample
            job.outputs = [([], [], "length") for _ in job.rows]
            return job
        return self.batcher.submit(job)

    def route(self, method: str, path: str) -> Optional[Callable]:
        """The endpoint answering ``method path``: a GET's takes nothing, a POST's the JSON body."""
        routes = {"GET": {"/v1/models": self.models, "/health": self.health, "/tokenizer_info": self.tokenizer_info},
                  "POST": {"/v1/completions": self.completions, "/v1/chat/completions": self.chat,
                           "/tokenize": self.tokenize, "/detokenize": self.detokenize,
                           "/update_weights_from_disk": self.update_weights,
                           "/v1/load_lora_adapter": self.load_lora_adapter}}
        return routes.get(method, {}).get(path)

    def health(self) -> dict:
        return {"status": "ok", "policy_version": self.batcher.version}

    def completions(self, body: dict, sample: Optional[Sampling] = None) -> dict | Streamed:
        """``sample`` replaces :meth:`sample` (a recording endpoint samples its own way)."""
        self._check_model(body)
        refuse_unsupported(body, chat=False)
        top = logprobs_asked(body, chat=False)
        prompts = completion_prompts(body.get("prompt"), self.tokenizer, flag(body, "add_special_tokens", True))
        job = (sample or self.sample)(body, [ids for ids, _ in prompts])
        wire = Wire(self.tokenizer, body, job.params, top)
        echo = flag(body, "echo")
        n = len(job.rows) // len(prompts)
        texts = [wire.text(ids) if text is None else text for ids, text in prompts for _ in range(n)]
        scored = (self.batcher.prompt_logprobs([ids for ids, _ in prompts], top, job.adapter)
                  if echo and top is not None else [([], [])] * len(prompts))
        scored = [s for s in scored for _ in range(n)]
        choices, deltas = [], []
        for i, (sampled, prompt_text, (prompt_lps, prompt_alts)) in enumerate(zip(job.sampled(), texts, scored)):
            text, stop_reason = wire.completion_text(sampled)
            choice = {"index": i, "text": prompt_text + text if echo else text, "logprobs": None,
                      "finish_reason": sampled.reason, "stop_reason": stop_reason, "token_ids": sampled.ids}
            if flag(body, "return_token_ids"):
                choice["prompt_token_ids"] = sampled.prompt
            own = None
            if top is not None:
                own = wire.completion_logprobs(sampled.ids, sampled.logprobs, sampled.alternatives,
                                               len(prompt_text) if echo else 0)
                choice["logprobs"] = (own if not echo else _joined(
                    wire.completion_logprobs(sampled.prompt, prompt_lps, prompt_alts), own))
            choices.append(choice)
            deltas.append(wire.completion_deltas(sampled, text, choice, prompt_text if echo else None, own))
        return self._answer(body, "text_completion", job, choices, deltas)

    def chat(self, body: dict, sample: Optional[Sampling] = None) -> dict | Streamed:
        self._check_model(body)
        refuse_unsupported(body, chat=True)
        top = logprobs_asked(body, chat=True)
        prompt = encode_prompt(self.tokenizer, chat_messages(body.get("messages")), self.sampler.chat_template,
                               tools=_tools(body))
        job = (sample or self.sample)(body, [prompt])
        wire = Wire(self.tokenizer, body, job.params, top)
        choices, deltas = [], []
        for i, sampled in enumerate(job.sampled()):
            text, stop_reason = wire.completion_text(sampled)
            entries = wire.chat_logprobs(sampled) if top is not None else None
            choices.append({"index": i, "finish_reason": sampled.reason, "stop_reason": stop_reason,
                            "token_ids": sampled.ids, "message": {"role": "assistant", "content": text},
                            "logprobs": None if entries is None else {"content": entries}})
            deltas.append(wire.chat_deltas(sampled, text, entries, stop_reason))
        return self._answer(body, "chat.completion", job, choices, deltas)

    def _answer(self, body: dict, kind: str, job: Job, choices: list[dict], deltas: list[list[dict]]) -> dict | Streamed:
        """The whole response, or with ``stream`` its chunks."""
        completion_tokens = sum(len(ids) for ids, _, _ in job.outputs)
        response = {"id": f"cmpl-{random.getrandbits(64):016x}", "object": kind, "created": int(time.time()),
                    "model": body.get("model") or self.name, "choices": choices, "policy_version": job.version,
                    "usage": usage(job.prompt_tokens, completion_tokens)}
        if not flag(body, "stream"):
            return response
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise RequestError("'stream_options' must be an object", param="stream_options")
        return Streamed(event_stream(response, kind == "chat.completion", deltas, flag(options, "include_usage")))

    def tokenize(self, body: dict) -> dict:
        """vLLM's ``/tokenize``: ``prompt`` (text) or ``messages`` to ``{count, max_model_len, tokens}``."""
        self._check_model(body)
        if "messages" in body:
            messages, tools = chat_messages(body["messages"]), _tools(body)
            if self.sampler.chat_template:
                tokens = chat_ids(self.tokenizer, messages, flag(body, "add_generation_prompt", True), tools)
            else:
                tokens = encode_prompt(self.tokenizer, messages, False)
        elif isinstance(body.get("prompt"), str):
            tokens = self.tokenizer(body["prompt"], add_special_tokens=flag(body, "add_special_tokens", True))["input_ids"]
        else:
            raise RequestError("/tokenize takes 'prompt' (text) or 'messages'", param="prompt")
        strings = [self.tokenizer.decode([t]) for t in tokens] if flag(body, "return_token_strs") else None
        return {"count": len(tokens), "max_model_len": self.sampler.context_length, "tokens": list(tokens),
                "token_strs": strings}

    def detokenize(self, body: dict) -> dict:
        """vLLM's ``/detokenize``: ``tokens`` to ``{prompt}``."""
        self._check_model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise RequestError("/detokenize takes 'tokens', a list of token ids", param="tokens")
        self.check_prompts([tokens] if tokens else [])
        return {"prompt": self.tokenizer.decode(tokens)}

    def tokenizer_info(self) -> dict:
        """vLLM's ``/tokenizer_info``: what a client needs to tokenize as the server does."""
        t = self.tokenizer
        return {"tokenizer_class": type(t).__name__, "eos_token": t.eos_token, "bos_token": t.bos_token,
                "pad_token": t.pad_token, "unk_token": t.unk_token, "model_max_length": self.sampler.context_length,
                "chat_template": t.chat_template if self.sampler.chat_template else None}

    def update_weights(self, body: dict) -> dict:
        folder = body.get("model_path")
        if not isinstance(folder, str) or not folder:
            raise RequestError("'model_path' must name a folder of safetensors weights", param="model_path")
        version = self.batcher.reload(folder, _version(body))
        return {"success": True, "message": f"loaded {folder}", "policy_version": version}

    def load_lora_adapter(self, body: dict) -> dict:
        name, folder = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or name == self.name:
            raise RequestError(f"'lora_name' must name the adapter, other than the base model {self.name!r}",
                               param="lora_name")
        if not isinstance(folder, str) or not folder:
            raise RequestError("'lora_path' must name a folder holding a peft adapter", param="lora_path")
        version = self.batcher.load_adapter(name, folder, _version(body))
        self.adapter = name
        return {"success": True, "message": f"loaded the LoRA adapter {name!r} from {folder}", "policy_version": version}


def _joined(first: dict, second: dict) -> dict:
    """Two ``logprobs`` blocks as one: the echoed prompt's, then the completion's."""
    return {key: first[key] + second[key] for key in first}


def _tools(body: dict) -> Optional[list]:
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be a list of tool definitions", param="tools")
    return tools or None


def _version(body: dict) -> Optional[int]:
    """The policy version a weight update asks for, if it names one."""
    version = body.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise RequestError(f"'version' must be an integer, got {version!r}", param="version")
    return version


class OpenAIHTTPServer(HTTPServer):
    """One thread per connection; the sampling itself happens on the batcher's thread.
    ``api_key``: the bearer token every request but ``GET /health`` must carry (None: none)."""

    request_queue_size = 256

    def __init__(self, server: Server, host: str = "127.0.0.1", port: int = 0, api_key: Optional[str] = None):
        self.app, self.api_key = server, api_key
        super().__init__(host, port, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120
    server: OpenAIHTTPServer

    def setup(self):
        super().setup()
        # headers and body are two writes: without this the body waits for the client's
        # delayed acknowledgement of the headers, ~40 ms a request
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format, *args):  # noqa: A002 - the base class names it so
        """Quiet: a line per request would drown a training run's output."""

    def _send(self, status: int, payload: dict | Streamed) -> None:
        streamed = isinstance(payload, Streamed)
        body = b"".join(payload.events) if streamed else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, param: Optional[str] = None) -> None:
        self._send(status, error_body(status, message, param))

    def _allowed(self) -> bool:
        """Whether the request carries the server's key (or none is needed); a 401 when not."""
        key = self.server.api_key
        if key is None or self.path == "/health":
            return True
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            return True
        self.close_connection = True
        self._error(401, "this server wants an API key: send 'Authorization: Bearer KEY' (the openai client's "
                         "api_key)")
        return False

    def do_GET(self):
        if not self._allowed():
            return
        route = self.server.app.route("GET", self.path)
        if route is None:
            self._error(404, f"no such endpoint: GET {self.path}")
        else:
            self._send(200, route())

    def do_POST(self):
        route = self.server.app.route("POST", self.path)
        length = self.headers.get("Content-Length", "")
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            self._error(413 if length.isdigit() else 411, f"a Content-Length up to {MAX_BODY_BYTES} bytes is required")
            return
        raw = self.rfile.read(int(length))
        if not self._allowed():
            return
        if route is None:
            self._error(404, f"no such endpoint: POST {self.path}")
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            self._send(200, route(body))
        except ValueError as exc:  # RequestError, or JSON that does not parse
            if isinstance(exc, RequestError):
                self._error(exc.status, str(exc), exc.param)
            else:
                self._error(400, "the request body is not valid JSON")
        except Exception as exc:  # a defect here; the client still gets an answer
            traceback.print_exc()
            self._error(500, f"internal error: {type(exc).__name__}: {exc}")


def start(sampler: HFGenerator, name: str, batch_size: int, host: str = "127.0.0.1", port: int = 0,
          limits: Limits = Limits(), api_key: Optional[str] = None) -> OpenAIHTTPServer:
    """A server answering on a background thread (``shutdown()`` stops it); port 0 picks a free one."""
    return serve_in_background(Server(sampler, name, batch_size, limits=limits), host, port, api_key)


def serve_in_background(app: Server, host: str = "127.0.0.1", port: int = 0,
                        api_key: Optional[str] = None) -> OpenAIHTTPServer:
    """``app`` answering HTTP on a daemon thread."""
    http = OpenAIHTTPServer(app, host, port, api_key)
    threading.Thread(target=http.serve_forever, name="openai-http", daemon=True).start()
    return http
