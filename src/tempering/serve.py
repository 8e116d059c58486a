"""``temper serve``: an OpenAI-compatible completions server over tempering's own sampler.

It exists so that the server path of training (``tempering.rollout.openai_server``) runs end
to end on a CPU, for ``temper eval`` against a served model, and for users without a GPU
inference engine. Its wire format is vLLM's, so one client reads both:

- ``POST /v1/completions``: ``prompt`` as text, token ids, or a list of either; ``n``,
  ``max_tokens``, ``temperature`` (0 = greedy), ``top_p``, ``stop``, ``seed``, ``logprobs``.
  Every choice carries ``token_ids`` (the exact ids sampled, as vLLM's ``return_token_ids``)
  and, when ``logprobs`` is set, ``logprobs.tokens`` (``"token_id:N"`` with
  ``return_tokens_as_token_ids``, else the tokens' text) and ``logprobs.token_logprobs``: the
  sampled tokens' log-probs under the temperature-scaled distribution, what the learner
  recomputes (vLLM's ``--logprobs-mode processed_logprobs``). Choices are ordered prompt by
  prompt, ``n`` each.
- ``POST /v1/chat/completions``: ``messages`` rendered with the chat template; the same
  options, ``logprobs: true`` giving ``logprobs.content`` entries.
- ``GET /v1/models``: the served model, its context (``max_model_len``) and policy version.
- ``POST /update_weights_from_disk`` (SGLang's name): ``{"model_path": DIR}`` loads the
  ``*.safetensors`` weights in DIR (a ``save_pretrained`` folder) and moves the policy
  version on by one, or to ``"version"`` when given (so a retried reload is harmless).
  Every completion response carries the ``policy_version`` that sampled it.
- ``POST /v1/load_lora_adapter`` (vLLM's): ``{"lora_name": NAME, "lora_path": DIR}`` loads
  the peft adapter in DIR (``adapter_config.json``, ``adapter_model.safetensors``) onto the
  served model, in place of any adapter loaded before (one at a time), and moves the policy
  version on as a reload does (``"version"`` too). Requests whose ``model`` is NAME sample
  with the adapter, others with the base; ``/v1/models`` lists NAME with the base as its
  ``parent``. Once an adapter is loaded, sampling runs through transformers' modules (the
  fused decoder reads plain weights) and full reloads are refused.

Concurrent requests are gathered into one sampler call (requests with the same sampling
settings, up to ``batch_size`` rows): each request draws from a random stream seeded by its
own ``seed`` (:class:`~tempering.rollout.hf.RowStreams`), so what a request gets does not
depend on what it was batched with. A reload waits for the sampler call in progress and
never overlaps one.

Not done: streaming, top-k alternatives in ``logprobs`` (the sampled token's only),
``echo``, ``best_of``, penalties, several adapters at once, authentication (it binds 127.0.0.1
unless told otherwise; put a proxy in front to expose it).
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
import traceback
from contextlib import nullcontext
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import accumulate
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from tempering.checkpoint import load_weights_from
from tempering.models.lora import adapters_off, is_adapted, serve_adapter
from tempering.rollout.base import SamplingParams
from tempering.rollout.hf import HFGenerator, RowStreams
from tempering.rollout.prompts import encode_prompt

MAX_BODY_BYTES = 64 << 20
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class RequestError(ValueError):
    """A request the client must change; answered with 400 and this message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Job:
    """One request's rows (each prompt ``n`` times, in order), waiting for the sampler."""

    rows: list[list[int]]
    params: SamplingParams
    seed: int
    prompt_tokens: int
    done: threading.Event = field(default_factory=threading.Event)
    outputs: Optional[list[tuple[list[int], list[float], str]]] = None
    error: Optional[BaseException] = None
    version: int = 0
    adapter: Optional[str] = None
    """The LoRA adapter to sample with; None = the base model."""

    def joins(self, other: "Job") -> bool:
        """Whether this job can share a sampler call with ``other``."""
        return self.params == other.params and self.adapter == other.adapter


Sampling = Callable[[dict, list[list[int]]], Job]
"""How an endpoint samples a request's prompts: ``(body, prompts) -> Job``."""


class Batcher:
    """Runs jobs through the sampler on one thread, gathering those waiting with the same
    settings into one call (at most ``max_rows`` rows, waiting ``gather_s`` for company)."""

    def __init__(self, sampler: HFGenerator, max_rows: int, gather_s: float = 0.01):
        self.sampler, self.max_rows, self.gather_s = sampler, max_rows, gather_s
        self.version = 0
        self.lock = threading.Lock()  # held while sampling or loading weights
        self._queue: queue.Queue[Job] = queue.Queue()
        self._held: list[Job] = []  # taken from the queue, waiting for a call with their settings
        threading.Thread(target=self._run, name="sampler", daemon=True).start()

    def submit(self, job: Job) -> Job:
        self._queue.put(job)
        job.done.wait()
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

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            rows = [ids for job in batch for ids in job.rows]
            owners = [k for k, job in enumerate(batch) for _ in job.rows]
            streams = RowStreams([torch.Generator().manual_seed(job.seed) for job in batch], owners)
            try:
                with self.lock, (nullcontext() if batch[0].adapter else adapters_off(self.sampler.model)):
                    outputs = self.sampler.sample(rows, batch[0].params, streams)
                    version = self.version
            except Exception as exc:  # every waiting request hears of it
                traceback.print_exc()
                for job in batch:
                    job.error = exc
                    job.done.set()
                continue
            start = 0
            for job in batch:
                job.outputs, job.version = outputs[start : start + len(job.rows)], version
                start += len(job.rows)
                job.done.set()

    def reload(self, folder: str, version: Optional[int]) -> int:
        """Load the weights saved in ``folder``; return the new policy version."""
        if not Path(folder).is_dir():
            raise RequestError(f"model_path {folder!r} is not a folder on the server")
        with self.lock:
            if is_adapted(self.sampler.model):
                raise RequestError("a LoRA adapter is loaded on this server: it takes new adapters "
                                   "(/v1/load_lora_adapter), not full weights; restart it to serve other weights")
            try:
                load_weights_from(self.sampler.model, Path(folder))
            except (FileNotFoundError, RuntimeError) as exc:
                raise RequestError(str(exc)) from None
            return self._advance(version)

    def load_adapter(self, name: str, folder: str, version: Optional[int]) -> int:
        """Serve the peft adapter saved in ``folder`` as ``name`` (in place of any other);
        return the new policy version."""
        if not Path(folder).is_dir():
            raise RequestError(f"lora_path {folder!r} is not a folder on the server")
        with self.lock:
            try:
                model = serve_adapter(self.sampler.model, Path(folder), name)
            except (FileNotFoundError, ValueError, RuntimeError) as exc:
                raise RequestError(f"lora_path {folder!r}: {exc}") from None
            if model is not self.sampler.model:  # first adapter: sample through the wrapper
                s = self.sampler
                self.sampler = HFGenerator(model, s.tokenizer, s.chat_template, s.batch_size, s.bf16, share=s.share)
            return self._advance(version)

    def _advance(self, version: Optional[int]) -> int:
        """The policy version after new weights: the next one, or ``version`` when the client names it."""
        self.version = self.version + 1 if version is None else version
        return self.version


def _number(body: dict, key: str, default: Any, kind: type, low: float, high: float = float("inf")) -> Any:
    value = body.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise RequestError(f"{key!r} must be a{'n integer' if kind is int else ' number'}, got {value!r}")
    if not low <= value <= high:
        raise RequestError(f"{key!r}={value} is outside [{low}, {high}]")
    return kind(value)


def sampling_request(body: dict, prompt_lengths: list[int], context: int) -> tuple[SamplingParams, int, int]:
    """``(params, n, seed)`` of a request; a RequestError for a bad or unfittable one."""
    remaining = context - max(prompt_lengths) if context else 0
    default_tokens = DEFAULT_MAX_TOKENS if "messages" not in body else max(1, remaining)
    tokens = _number(body, "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens",
                     default_tokens, int, 1)
    if context and tokens > remaining:
        raise RequestError(f"this model's maximum context length is {context} tokens; the prompt ({max(prompt_lengths)} "
                           f"tokens) and max_tokens ({tokens}) are more")
    temperature = _number(body, "temperature", 1.0, float, 0.0, 100.0)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop' must be a string or a list of non-empty strings")
    params = SamplingParams(temperature=temperature or 1.0, top_p=_number(body, "top_p", 1.0, float, 1e-9, 1.0),
                            max_new_tokens=tokens, stop=tuple(stop), greedy=temperature == 0)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"'seed' must be an integer, got {seed!r}")
    seed = random.SystemRandom().randrange(2**63) if seed is None else seed % 2**63
    return params, _number(body, "n", 1, int, 1, 1024), seed


def completion_prompts(prompt: Any, tokenizer: Any) -> list[list[int]]:
    """The token ids of a ``/v1/completions`` prompt: text, ids, or a list of either."""
    if isinstance(prompt, str):
        return [tokenizer(prompt)["input_ids"]]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [ids for p in prompt for ids in completion_prompts(p, tokenizer)]
    raise RequestError("'prompt' must be text, a list of token ids, or a non-empty list of either")


class Server:
    """What the HTTP handlers call: request in, response body out."""

    def __init__(self, sampler: HFGenerator, name: str, batch_size: int, gather_s: float = 0.01):
        self.sampler, self.name = sampler, name
        self.tokenizer = sampler.tokenizer
        self.vocab = len(self.tokenizer)
        self.batcher = Batcher(sampler, batch_size, gather_s)
        self.adapter: Optional[str] = None  # the LoRA adapter's name, once one is loaded

    def models(self) -> dict:
        about = {"object": "model", "owned_by": "tempering", "created": 0,
                 "max_model_len": self.sampler.context_length, "policy_version": self.batcher.version}
        adapters = [] if self.adapter is None else [{"id": self.adapter, "parent": self.name, **about}]
        return {"object": "list", "data": [{"id": self.name, **about}, *adapters]}

    def _check_model(self, body: dict) -> None:
        if body.get("model") not in (None, self.name, self.adapter):
            raise RequestError(f"the model {body['model']!r} does not exist; this server serves "
                               f"{', '.join(repr(m['id']) for m in self.models()['data'])}", 404)

    def check_prompts(self, prompts: list[list[int]]) -> None:
        if any(not p for p in prompts):
            raise RequestError("a prompt is empty")
        if any(not 0 <= t < self.vocab for p in prompts for t in p):
            raise RequestError(f"a prompt holds a token id outside the vocabulary (0..{self.vocab - 1})")

    def sample(self, body: dict, prompts: list[list[int]]) -> Job:
        """Sample ``prompts`` as ``body`` asks (the endpoints' default way of sampling)."""
        self.check_prompts(prompts)
        params, n, seed = sampling_request(body, [len(p) for p in prompts], self.sampler.context_length)
        adapter = self.adapter if self.adapter is not None and body.get("model") == self.adapter else None
        return self.run(prompts, params, n, seed, adapter)

    def run(self, prompts: list[list[int]], params: SamplingParams, n: int, seed: int,
            adapter: Optional[str] = None) -> Job:
        """``n`` samples of each prompt, through the batcher (with the LoRA ``adapter``, if named)."""
        return self.batcher.submit(Job([p for p in prompts for _ in range(n)], params, seed, sum(map(len, prompts)),
                                       adapter=adapter))

    def route(self, method: str, path: str) -> Optional[Callable]:
        """The endpoint answering ``method path``: a GET's takes nothing, a POST's the JSON body."""
        routes = {"GET": {"/v1/models": self.models, "/health": self.health},
                  "POST": {"/v1/completions": self.completions, "/v1/chat/completions": self.chat,
                           "/update_weights_from_disk": self.update_weights,
                           "/v1/load_lora_adapter": self.load_lora_adapter}}
        return routes.get(method, {}).get(path)

    def health(self) -> dict:
        return {"status": "ok", "policy_version": self.batcher.version}

    def completions(self, body: dict, sample: Optional[Sampling] = None) -> dict:
        """``sample`` replaces :meth:`sample` (a recording endpoint samples its own way)."""
        self._check_model(body)
        job = (sample or self.sample)(body, completion_prompts(body.get("prompt"), self.tokenizer))
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        choices = [self._choice(i, ids, logprobs, reason, body.get("logprobs") is not None, as_ids)
                   for i, (ids, logprobs, reason) in enumerate(job.outputs)]
        return self._response("text_completion", job, choices)

    def chat(self, body: dict, sample: Optional[Sampling] = None) -> dict:
        self._check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise RequestError("'messages' must be a non-empty list of {role, content} objects")
        prompt = encode_prompt(self.tokenizer, messages, self.sampler.chat_template)
        job = (sample or self.sample)(body, [prompt])
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        choices = []
        for i, (ids, logprobs, reason) in enumerate(job.outputs):
            choice = {"index": i, "finish_reason": reason, "token_ids": ids,
                      "message": {"role": "assistant", "content": self._text(ids)}, "logprobs": None}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [{"token": token, "logprob": lp, "bytes": None, "top_logprobs": []}
                                                  for token, lp in zip(self._tokens(ids, as_ids), logprobs)]}
            choices.append(choice)
        return self._response("chat.completion", job, choices)

    def _choice(self, index: int, ids: list[int], logprobs: list[float], reason: str, with_logprobs: bool,
                as_ids: bool) -> dict:
        choice = {"index": index, "text": self._text(ids), "finish_reason": reason, "token_ids": ids,
                  "logprobs": None}
        if with_logprobs:
            lengths = [len(self.tokenizer.decode([t])) for t in ids]
            offsets = [0, *accumulate(lengths)][: len(ids)]
            choice["logprobs"] = {"tokens": self._tokens(ids, as_ids), "token_logprobs": logprobs,
                                  "text_offset": offsets, "top_logprobs": None}
        return choice

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _tokens(self, ids: list[int], as_ids: bool) -> list[str]:
        return [f"token_id:{t}" for t in ids] if as_ids else [self.tokenizer.decode([t]) for t in ids]

    def _response(self, kind: str, job: Job, choices: list[dict]) -> dict:
        completion_tokens = sum(len(ids) for ids, _, _ in job.outputs)
        prompt_tokens = job.prompt_tokens
        return {"id": f"cmpl-{random.getrandbits(64):016x}", "object": kind, "created": int(time.time()),
                "model": self.name, "choices": choices, "policy_version": job.version,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    def update_weights(self, body: dict) -> dict:
        folder = body.get("model_path")
        if not isinstance(folder, str) or not folder:
            raise RequestError("'model_path' must name a folder of safetensors weights")
        version = self.batcher.reload(folder, _version(body))
        return {"success": True, "message": f"loaded {folder}", "policy_version": version}

    def load_lora_adapter(self, body: dict) -> dict:
        name, folder = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or name == self.name:
            raise RequestError(f"'lora_name' must name the adapter, other than the base model {self.name!r}")
        if not isinstance(folder, str) or not folder:
            raise RequestError("'lora_path' must name a folder holding a peft adapter")
        version = self.batcher.load_adapter(name, folder, _version(body))
        self.adapter = name
        return {"success": True, "message": f"loaded the LoRA adapter {name!r} from {folder}", "policy_version": version}


def _version(body: dict) -> Optional[int]:
    """The policy version a weight update asks for, if it names one."""
    version = body.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise RequestError(f"'version' must be an integer, got {version!r}")
    return version


class OpenAIHTTPServer(ThreadingHTTPServer):
    """One thread per connection; the sampling itself happens on the batcher's thread."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, server: Server, host: str = "127.0.0.1", port: int = 0):
        self.app = server
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120
    server: OpenAIHTTPServer

    def log_message(self, format, *args):  # noqa: A002 - the base class names it so
        """Quiet: a line per request would drown a training run's output."""

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

    def do_GET(self):
        route = self.server.app.route("GET", self.path)
        if route is None:
            self._error(404, f"no such endpoint: GET {self.path}")
        else:
            self._send(200, route())

    def do_POST(self):
        route = self.server.app.route("POST", self.path)
        if route is None:
            self._error(404, f"no such endpoint: POST {self.path}")
            return
        length = self.headers.get("Content-Length", "")
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            self._error(413 if length.isdigit() else 411, f"a Content-Length up to {MAX_BODY_BYTES} bytes is required")
            return
        try:
            body = json.loads(self.rfile.read(int(length)))
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            self._send(200, route(body))
        except ValueError as exc:  # RequestError, or JSON that does not parse
            self._error(getattr(exc, "status", 400), str(exc) if isinstance(exc, RequestError)
                        else "the request body is not valid JSON")
        except Exception as exc:  # a defect here; the client still gets an answer
            traceback.print_exc()
            self._error(500, f"internal error: {type(exc).__name__}: {exc}")


def start(sampler: HFGenerator, name: str, batch_size: int, host: str = "127.0.0.1", port: int = 0
          ) -> OpenAIHTTPServer:
    """A server answering on a background thread (``shutdown()`` stops it); port 0 picks a free one."""
    return serve_in_background(Server(sampler, name, batch_size), host, port)


def serve_in_background(app: Server, host: str = "127.0.0.1", port: int = 0) -> OpenAIHTTPServer:
    """``app`` answering HTTP on a daemon thread."""
    http = OpenAIHTTPServer(app, host, port)
    threading.Thread(target=http.serve_forever, name="openai-http", daemon=True).start()
    return http
