"""``temper serve``: an OpenAI-compatible completions server over tempering's own sampler.

It exists so that the server path of training (``tempering.rollout.remote``) runs end
to end on a CPU, for ``temper eval`` and lm-evaluation-harness against a served model, and for
users without a GPU inference engine. It answers as vLLM's OpenAI server does, so one client
reads both (the fields and answers: ``tempering.rollout.openai_api``):

- ``POST /v1/completions``: ``prompt`` as text, token ids, or a list of either; ``n``,
  ``max_tokens``, ``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``min_p``, the
  penalties, ``logit_bias``, ``stop``, ``stop_token_ids``, ``min_tokens``, ``ignore_eos``,
  ``seed``, ``logprobs: N`` (at most 20), ``echo`` (with ``max_tokens: 0``, the prompt's
  log-probs alone), ``stream`` (each token's chunk sent as it is drawn:
  ``tempering.rollout.streaming``). Every choice carries ``token_ids`` (the exact ids sampled, as
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
- ``POST /weights/begin``, ``/weights/chunk``, ``/weights/commit``: new weights (or a LoRA
  adapter) sent over HTTP in chunks with a SHA-256 and the version they are, assembled beside
  the served model and swapped in whole at the commit; an incomplete or corrupted transfer is a
  400 and leaves the served weights and version as they were (``tempering.rollout.weight_transfer``).
- ``POST /v1/load_lora_adapter`` (vLLM's): ``{"lora_name": NAME, "lora_path": DIR}`` loads
  the peft adapter in DIR (``adapter_config.json``, ``adapter_model.safetensors``) onto the
  served model, in place of any adapter loaded before (one at a time), and moves the policy
  version on as a reload does (``"version"`` too). Requests whose ``model`` is NAME sample
  with the adapter, others with the base; ``/v1/models`` lists NAME with the base as its
  ``parent``. Once an adapter is loaded, sampling runs through transformers' modules (the
  fused decoder reads plain weights) and full reloads are refused. ``/v1/unload_lora_adapter``
  stops serving it; ``/version``, ``/reset_prefix_cache``, ``/weight_info`` and
  ``/update_weight_version`` answer as vLLM's do, and vLLM's weight-transfer API is a 501
  (``tempering.rollout.weights_api``).

Concurrent requests are gathered into one sampler call (requests with the same sampling
settings, up to ``batch_size`` rows; a larger request runs as several calls of that size):
each sample draws from a random stream of its own, seeded from the request's ``seed`` as vLLM
seeds it (:mod:`tempering.rollout.batcher`), so what a request gets does not depend on what
it was batched with. A reload waits for the sampler call in progress and never overlaps one.
A request whose client hangs up is dropped, queued or running.

Bounds (:class:`Limits`): a request's token positions (its rows, prompts times ``n``, each
prompt's length plus ``max_tokens``) are capped (400 naming the limit and its option), and so
are all the positions waiting or being sampled (429: retry later). With an ``api_key`` every
endpoint but ``/health`` wants ``Authorization: Bearer KEY`` (401 otherwise), as vLLM's
``--api-key`` does; ``temper serve`` refuses a non-loopback address without one.

Not done: tool-call parsing, structured output, beam search, ``suffix``, ``best_of``,
``logprob_token_ids``, ``repetition_detection``, priority scheduling; several adapters at
once; continuous batching (a request that comes while a call runs waits for its end); TLS
(put a proxy in front for it).
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
from http.server import BaseHTTPRequestHandler
from typing import Callable, Optional
from urllib.parse import parse_qsl, urlsplit

from tempering.httpd import ClientGone, HTTPServer, answering
from tempering.rollout.base import SamplingParams
from tempering.rollout.batcher import Batcher, Job, Limits
from tempering.rollout.hf import HFGenerator
from tempering.rollout.openai_api import (RequestError, Wire, chat_messages, completion_prompts, error_body, flag,
                                          logprobs_asked, refuse_unsupported, sampling_request, usage)
from tempering.rollout.prompts import chat_ids, encode_prompt
from tempering.rollout.streaming import ChoiceStream, Streamed, stream, usage_options
from tempering.rollout.weight_transfer import Assembly
from tempering.rollout.weights_api import RAW_POSTS, WeightEndpoints, transfer_limit

__all__ = ["Batcher", "Job", "Limits", "OpenAIHTTPServer", "Server", "serve_in_background", "start"]

MAX_BODY_BYTES = 64 << 20

Sampling = Callable[[dict, list[list[int]]], Job]
"""How an endpoint samples a request's prompts: ``(body, prompts) -> Job``."""


class Server(WeightEndpoints):
    """What the HTTP handlers call: request in, response body out."""

    def __init__(self, sampler: HFGenerator, name: str, batch_size: int, gather_s: float = 0.01,
                 limits: Limits = Limits()):
        self.sampler, self.name, self.limits = sampler, name, limits
        self.tokenizer = sampler.tokenizer
        self.vocab = len(self.tokenizer)
        self.batcher = Batcher(sampler, batch_size, gather_s, limits)
        self.adapter: Optional[str] = None  # the LoRA adapter's name, once one is loaded
        self.replaced_adapters: set[str] = set()
        self._assembly: Optional[Assembly] = None

    @property
    def assembly(self) -> Assembly:
        """The weight transfer over HTTP, made at the first one: its size limit reads the served
        model, which a server over another sampler (an agent's calls recorded on their way to a
        remote server or to vLLM) does not hold, and which never takes a transfer."""
        if self._assembly is None:
            self._assembly = Assembly(transfer_limit(self.sampler.model))
        return self._assembly

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
        """Sample ``prompts`` as ``body`` asks (the endpoints' default way of sampling); a
        streamed request's job comes back queued, the others' sampled."""
        self.check_prompts(prompts)
        params, n, seed = sampling_request(body, [len(p) for p in prompts], self.sampler.context_length, self.vocab)
        adapter = self.adapter if self.adapter is not None and body.get("model") == self.adapter else None
        return self.run(prompts, params, n, seed, adapter, logprobs_asked(body, "messages" in body) or 0,
                        stream=flag(body, "stream"))

    def run(self, prompts: list[list[int]], params: SamplingParams, n: int, seed: Optional[int],
            adapter: Optional[str] = None, top: int = 0, stream: bool = False) -> Job:
        """``n`` samples of each prompt, through the batcher (with the LoRA ``adapter``, if
        named), with the ``top`` most likely alternatives of each token; a RequestError when
        the request is over :attr:`Limits.request_tokens`. Sample ``j`` of every prompt draws
        from seed ``seed + j``, as vLLM seeds a request's prompts and samples (no seed: each
        prompt one drawn at random). With ``stream`` the job comes back queued, its steps to
        come on ``job.events``."""
        chosen = random.SystemRandom()
        seeds = [seed if seed is not None else chosen.randrange(2**63) for _ in prompts]
        job = Job([p for p in prompts for _ in range(n)], params, [(s + j) % 2**63 for s in seeds for j in range(n)],
                  sum(map(len, prompts)), top=top, adapter=adapter, events=queue.Queue() if stream else None)
        if job.positions > self.limits.request_tokens:
            raise RequestError(f"this request asks for {job.positions} token positions ({len(prompts)} prompts x "
                               f"n={n}, each its prompt plus max_tokens={params.max_new_tokens}), over this "
                               f"server's limit of {self.limits.request_tokens} a request (temper serve "
                               "--max-request-tokens); send fewer prompts, a smaller n or max_tokens")
        if not params.max_new_tokens:  # echo alone: nothing to sample
            job.outputs = [([], [], "length") for _ in job.rows]
            job.done.set()
            return job
        self.batcher.submit(job)
        return job if stream else self.batcher.wait(job)

    def route(self, method: str, path: str) -> Optional[Callable]:
        """The endpoint answering ``method path``: a GET's takes nothing, a POST's the JSON body."""
        routes = {"GET": {"/v1/models": self.models, "/health": self.health, "/tokenizer_info": self.tokenizer_info,
                          **self.weight_routes("GET")},
                  "POST": {"/v1/completions": self.completions, "/v1/chat/completions": self.chat,
                           "/tokenize": self.tokenize, "/detokenize": self.detokenize, **self.weight_routes("POST")}}
        return routes.get(method, {}).get(path)

    def health(self) -> dict:
        return {"status": "ok", "policy_version": self.batcher.version}

    def completions(self, body: dict, sample: Optional[Sampling] = None) -> dict | Streamed:
        """``sample`` replaces :meth:`sample` (a recording endpoint samples its own way)."""
        self._check_model(body)
        refuse_unsupported(body, chat=False)
        top = logprobs_asked(body, chat=False)
        options = usage_options(body)
        prompts = completion_prompts(body.get("prompt"), self.tokenizer, flag(body, "add_special_tokens", True))
        job = (sample or self.sample)(body, [ids for ids, _ in prompts])
        wire = Wire(self.tokenizer, body, job.params, top)
        echo = flag(body, "echo")
        n = len(job.rows) // len(prompts)
        texts = [wire.text(ids) if text is None else text for ids, text in prompts for _ in range(n)]
        scored = (self.batcher.prompt_logprobs([ids for ids, _ in prompts], top, job.adapter)
                  if echo and top is not None else [([], [])] * len(prompts))
        scored = [s for s in scored for _ in range(n)]
        echoed = [wire.completion_logprobs(row, lps, alts) if top is not None else None
                  for row, (lps, alts) in zip(job.rows, scored)]
        if flag(body, "stream"):
            streams = [ChoiceStream(wire, False, len(row), len(text) if echo else 0) for row, text in zip(job.rows, texts)]
            first = [{"text": text, "logprobs": lps, "finish_reason": None, "stop_reason": None} if echo else None
                     for text, lps in zip(texts, echoed)]
            return Streamed(stream(job, self._head(body), False, streams, first, *options), job)
        choices = []
        for i, (sampled, prompt_text, prompt_logprobs) in enumerate(zip(job.sampled(), texts, echoed)):
            text, stop_reason = wire.completion_text(sampled)
            choice = {"index": i, "text": prompt_text + text if echo else text, "logprobs": None,
                      "finish_reason": sampled.reason, "stop_reason": stop_reason, "token_ids": sampled.ids}
            if flag(body, "return_token_ids"):
                choice["prompt_token_ids"] = sampled.prompt
            if top is not None:
                own = wire.completion_logprobs(sampled.ids, sampled.logprobs, sampled.alternatives,
                                               len(prompt_text) if echo else 0)
                choice["logprobs"] = _joined(prompt_logprobs, own) if echo else own
            choices.append(choice)
        return self._answer(body, "text_completion", job, choices)

    def chat(self, body: dict, sample: Optional[Sampling] = None) -> dict | Streamed:
        self._check_model(body)
        refuse_unsupported(body, chat=True)
        top = logprobs_asked(body, chat=True)
        options = usage_options(body)
        prompt = encode_prompt(self.tokenizer, chat_messages(body.get("messages")), self.sampler.chat_template,
                               tools=_tools(body))
        job = (sample or self.sample)(body, [prompt])
        wire = Wire(self.tokenizer, body, job.params, top)
        if flag(body, "stream"):
            role = {"delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            streams = [ChoiceStream(wire, True, len(prompt)) for _ in job.rows]
            return Streamed(stream(job, self._head(body), True, streams, [role] * len(streams), *options), job)
        choices = []
        for i, sampled in enumerate(job.sampled()):
            text, stop_reason = wire.completion_text(sampled)
            entries = wire.chat_logprobs(sampled) if top is not None else None
            choices.append({"index": i, "finish_reason": sampled.reason, "stop_reason": stop_reason,
                            "token_ids": sampled.ids, "message": {"role": "assistant", "content": text},
                            "logprobs": None if entries is None else {"content": entries}})
        return self._answer(body, "chat.completion", job, choices)

    def _head(self, body: dict) -> dict:
        """The fields every response and chunk of a request starts with."""
        return {"id": f"cmpl-{random.getrandbits(64):016x}", "created": int(time.time()),
                "model": body.get("model") or self.name}

    def _answer(self, body: dict, kind: str, job: Job, choices: list[dict]) -> dict:
        completion_tokens = sum(len(ids) for ids, _, _ in job.outputs)
        return {**self._head(body), "object": kind, "choices": choices, "policy_version": job.version,
                "usage": usage(job.prompt_tokens, completion_tokens)}

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


def _joined(first: dict, second: dict) -> dict:
    """Two ``logprobs`` blocks as one: the echoed prompt's, then the completion's."""
    return {key: first[key] + second[key] for key in first}


def _tools(body: dict) -> Optional[list]:
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be a list of tool definitions", param="tools")
    return tools or None


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
        if isinstance(payload, Streamed):
            self._send_events(payload)
            return
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_events(self, payload: Streamed) -> None:
        """Server-sent events in chunked transfer encoding, each written as it is made; a client
        that hangs up closes the stream (which drops its job)."""
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in payload.events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (ClientGone, OSError):
            self.close_connection = True
        finally:
            payload.close()

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

    def _answer(self, method: str, raw: Optional[bytes] = None) -> None:
        """Route the request (its path without the query) and send the endpoint's answer, or
        the error it raised. A POST's body is JSON (none: an empty object)."""
        split = urlsplit(self.path)
        path = split.path
        route = self.server.app.route(method, path)
        if route is None:
            self._error(404, f"no such endpoint: {method} {path}")
            return
        try:
            with answering(self.connection):
                if method == "GET":
                    self._send(200, route())
                    return
                if path in RAW_POSTS:
                    self._send(200, route({**dict(parse_qsl(split.query)), "data": raw}))
                    return
                body = json.loads(raw) if raw.strip() else {}
                if not isinstance(body, dict):
                    raise RequestError("the request body must be a JSON object")
                self._send(200, route(body))
        except ClientGone:  # no one to answer
            self.close_connection = True
        except ValueError as exc:  # RequestError, or JSON that does not parse
            if isinstance(exc, RequestError):
                self._error(exc.status, str(exc), exc.param)
            else:
                self._error(400, "the request body is not valid JSON")
        except Exception as exc:  # a defect here; the client still gets an answer
            traceback.print_exc()
            self._error(500, f"internal error: {type(exc).__name__}: {exc}")

    def do_GET(self):
        if self._allowed():
            self._answer("GET")

    def do_POST(self):
        length = self.headers.get("Content-Length", "0")  # none: no body (HTTP/1.1)
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            self._error(413 if length.isdigit() else 400, f"a Content-Length up to {MAX_BODY_BYTES} bytes is required")
            return
        raw = self.rfile.read(int(length))
        if self._allowed():
            self._answer("POST", raw)


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
