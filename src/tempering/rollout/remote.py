"""Rollouts from an OpenAI-compatible inference server: ``temper serve``, vLLM or SGLang.

:class:`ServerGenerator` is a :class:`~tempering.rollout.base.Generator` and a
:class:`~tempering.rollout.base.TokenSampler` whose sampling happens on a server. Prompts
are rendered and tokenized here and sent as token ids to ``/v1/completions``; the reply's
``token_ids`` (or ``logprobs.tokens`` as ``"token_id:N"``, vLLM's
``return_tokens_as_token_ids``) and ``logprobs.token_logprobs`` are kept as they are, so the
learner trains on exactly the tokens sampled and compares log-probs token by token. The
server must report log-probs of the temperature-scaled distribution, which ``temper serve``
does and vLLM does with ``--logprobs-mode processed_logprobs``.

Each problem (each episode turn, through :meth:`ServerGenerator.sample`) is one request, up
to ``concurrency`` in flight; a server that batches concurrent requests (all of these do)
sees them together. A server started with an API key (``temper serve --api-key``, vLLM's
``--api-key``) gets it as ``Authorization: Bearer`` from ``$TEMPER_SERVE_API_KEY``. Every
request carries a ``seed`` drawn from the run's generator in a fixed order before any is
sent, so a run against ``temper serve`` repeats itself, and a request sent again draws the
same tokens. A request answered with 429 or a 5xx is sent again to the same server after
``backoff_s``, doubling, up to ``retries`` times.

Several URLs (servers of one model, each at the same policy version) share the requests by
load and fail over (``tempering.rollout.balance`` holds the policy): each request goes to
the server with the fewest in flight; a server that does not answer (no connection, no reply
within ``timeout_s``, or a reply from weights older than the run's: it was restarted) is
marked down and the request sent to another with its seed. A down server is probed
``probe_s`` after, then at doubling intervals (at most ``max_probe_s``); once it answers,
the weights the run loaded last are loaded onto it at the run's version before it takes a
request again. Every round (:meth:`ServerGenerator.check_servers`) first probes the servers
due, then asks each server up for its policy version: one behind the run's was restarted
between two requests and is reloaded now, one ahead of it was changed by another client (an
error). One server is the same case with nobody to fail over to: its requests wait for it.
When no server has been up for ``down_timeout_s``, sampling stops with a ServerError naming
each server and its last error. :meth:`ServerGenerator.record` is what each step logs of
this (``server/<i>/...``).

Weight sync: :meth:`ServerGenerator.load_weights` writes the learner's weights as
``model.safetensors`` beside the model's config and tokenizer in ``weights_dir`` and asks
the server to load that folder: ``POST /update_weights_from_disk`` (``temper serve``,
SGLang) with the server version it should reach, or, with ``reload: vllm``, through vLLM's
development endpoints (``tempering.rollout.vllm_sync``: reload, prefix cache reset, weight
version). The server's policy version after the reload is checked, and every completion reply
that states its version must state that one: rollouts are sampled by the weights last loaded,
and stamped with the learner version those were.

With ``weight_transfer: "http"`` nothing is written for the server to read: the weights (or the
adapter) go to each server over HTTP in chunks of ``chunk_bytes`` with their SHA-256 and
version, and the server swaps them in whole at the commit (``tempering.rollout.weight_transfer``;
``temper serve`` only). The last payload stays in memory, to be sent to a server that comes back.

A run with LoRA adapters (``adapted``: the learner's peft model) syncs the adapters alone:
peft's two files in ``weights_dir/adapter``, loaded with vLLM's ``POST /v1/load_lora_adapter``
(``temper serve``; vLLM started with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) under ``adapter_name``, which later requests name
as their ``model``, whichever ``reload`` is set (but ``none``); vLLM gets each step's adapter
in a fresh folder under a fresh name (``tempering.rollout.vllm_sync``). The server's base must
be the learner's base.

A server that answers an error (4xx, or a 5xx still there after the retries) is quoted: its
own message reaches the user. ``launched``, a server this run started
(``tempering.rollout.vllm_launch``), is stopped by :meth:`ServerGenerator.close`.

Not done: weight transfer over NCCL, streaming, servers that differ in model or version;
with ``reload: vllm``, a server down during a reload stops the run, and one that comes back
at other weights stays down (vLLM's weight version is the run's only through every server
reloading together).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from tempering.rollout.balance import ServerPool
from tempering.rollout.base import SamplingParams, ServerError
from tempering.rollout.prompts import use_chat_template
from tempering.rollout.requests import Drawn, RequestSampler
from tempering.rollout.vllm_sync import VllmSync
from tempering.rollout.weight_transfer import Payload, adapter_payload, send, weights_payload

RELOADS = ("update_weights_from_disk", "vllm", "none")
TRANSFERS = ("disk", "http")
API_KEY_VARIABLE = "TEMPER_SERVE_API_KEY"
LOG = logging.getLogger("tempering.rollout.remote")


class _Transient(Exception):
    """A failure worth retrying: no connection, a timeout, 429 or a 5xx status (``answered``: the
    server replied, and the message quotes it)."""

    def __init__(self, message: str, answered: bool = False):
        super().__init__(message)
        self.answered = answered


class _Unreachable(Exception):
    """A server that does not answer (or answers from weights it was restarted with): its
    request goes to another server, and it is marked down."""


@dataclass(frozen=True)
class ServerSettings:
    url: str | tuple[str, ...]
    """Base URL, e.g. http://127.0.0.1:8000 (the /v1 paths are added), or several serving one model."""
    model: Optional[str] = None
    """Model name sent with each request; None = the first the server lists."""
    timeout_s: float = 300.0
    retries: int = 3
    backoff_s: float = 0.5
    concurrency: int = 64
    weights_dir: Optional[str] = None
    """Where new weights are written for the server to load; None = a temporary folder."""
    reload: str = "update_weights_from_disk"
    adapter_name: str = "tempering-lora"
    """The name LoRA adapters are loaded under (runs with adapters only)."""
    api_key: Optional[str] = None
    """Bearer token sent with every request; None = ``$TEMPER_SERVE_API_KEY`` when set, else none."""
    down_timeout_s: float = 120.0
    """Seconds with no server up before sampling stops with an error."""
    probe_s: float = 1.0
    """Seconds from a server going down to its first probe; doubling after each failed one."""
    max_probe_s: float = 30.0
    """The longest wait between two probes of a down server."""
    weight_transfer: str = "disk"
    """How new weights reach the servers: ``disk`` (a folder they read) or ``http`` (sent in chunks)."""
    chunk_bytes: int = 8 << 20
    """The size of one chunk of an ``http`` transfer."""


def parse_choice(choice: dict) -> tuple[list[int], list[float], str]:
    """``(token ids, log-probs, "stop" | "length")`` of one completion choice, from
    ``token_ids`` or vLLM's ``"token_id:N"`` tokens; a ServerError when the reply lacks them.

    >>> parse_choice({"finish_reason": "stop", "logprobs": {"tokens": ["token_id:5", "token_id:2"],
    ...                                                      "token_logprobs": [-0.5, -0.25]}})
    ([5, 2], [-0.5, -0.25], 'stop')
    """
    details = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    tokens = details.get("tokens")
    if ids is None and tokens is not None and all(t.startswith("token_id:") for t in tokens):
        ids = [int(t[len("token_id:"):]) for t in tokens]
    logprobs = details.get("token_logprobs")
    if ids is None or logprobs is None or len(ids) != len(logprobs):
        raise ServerError("the server's reply lacks the sampled token ids or their log-probs; it must support "
                          "logprobs with return_tokens_as_token_ids (vLLM, SGLang and temper serve do)")
    return list(ids), [float(x) for x in logprobs], "length" if choice.get("finish_reason") == "length" else "stop"


class ServerGenerator(RequestSampler):
    """Samples on an OpenAI-compatible server (see the module docstring); ``tokenizer`` must
    be the served model's, and ``model_config`` (written beside reloaded weights) its config;
    ``adapted``, a peft model, when only its LoRA adapters are synced; ``launched``, a server
    this run started (one URL), stopped with this generator."""

    def __init__(self, settings: ServerSettings, tokenizer: Any, model_config: Any = None,
                 chat_template: Optional[bool] = None, adapted: Any = None, launched: Any = None):
        if settings.reload not in RELOADS:
            raise ValueError(f"reload {settings.reload!r}; known: {', '.join(RELOADS)}")
        if settings.weight_transfer not in TRANSFERS or (settings.weight_transfer == "http" and settings.reload == "vllm"):
            raise ValueError(f"weight_transfer {settings.weight_transfer!r} with reload {settings.reload!r}; "
                             f"known: {', '.join(TRANSFERS)}, and vLLM servers take weights from disk alone")
        self.settings = settings
        self.urls = [u.rstrip("/") for u in ((settings.url,) if isinstance(settings.url, str) else settings.url)]
        if not self.urls:
            raise ServerError("no server URL is given")
        self.api_key = settings.api_key or os.environ.get(API_KEY_VARIABLE) or None
        self.tokenizer, self.model_config, self.adapted, self.launched = tokenizer, model_config, adapted, launched
        self.chat_template = use_chat_template(tokenizer, chat_template)
        self.model = settings.model
        found = [self._served(url) for url in self.urls]
        served = found[0]
        versions = [m.get("policy_version") for m in found]
        if len(set(versions)) > 1:
            listing = ", ".join(f"{url} at {version}" for url, version in zip(self.urls, versions))
            raise ServerError(f"the servers are at different policy versions ({listing}); start them on the same weights")
        self.context_length = int(served.get("max_model_len") or getattr(model_config, "max_position_embeddings", 0) or 0)
        self.served_version: Optional[int] = served.get("policy_version")
        self.vllm = VllmSync(self._request, self.urls, ServerError) if settings.reload == "vllm" else None
        if self.vllm is not None:
            self.served_version = self.vllm.version
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="server-request")
        self._weights_dir: Optional[Path] = None
        self.servers = ServerPool(self.urls, settings.probe_s, settings.max_probe_s)
        for url, entry in zip(self.urls, found):
            self.servers.checked(url, entry.get("policy_version"))
        self._last_load: Optional[Callable[[str, int, bool], None]] = None
        """The load every server took last, ``(url, version, failover)``: replayed onto a server
        brought back. None = the servers' own weights."""
        self.batch_size = sys.maxsize  # every row at once: the pool keeps ``concurrency`` requests in flight

    def _served(self, url: str) -> dict:
        """``url``'s entry for the model (the first it lists when none is named, then that one for every server)."""
        listed = self._request("GET", "/v1/models", None, url=url)["data"]
        if not listed:
            raise ServerError(f"{url}/v1/models lists no model")
        self.model = self.model or listed[0]["id"]
        served = next((m for m in listed if m["id"] == self.model), None)
        if served is None:
            raise ServerError(f"{url} does not serve {self.model!r} (it serves {', '.join(m['id'] for m in listed)})")
        return served

    # -- sampling ------------------------------------------------------------------------
    def _complete_all(self, prompts: list[list[int]], n: int, params: SamplingParams,
                      seeds: list[int]) -> list[list[Drawn]]:
        self.check_servers()
        futures = [self._pool.submit(self._dispatch, ids, n, params, seed) for ids, seed in zip(prompts, seeds)]
        return [future.result() for future in futures]

    def _dispatch(self, prompt_ids: list[int], n: int, params: SamplingParams, seed: int) -> list[Drawn]:
        """One request on the least loaded server up, sent again (same seed) to another while
        the one it went to stops answering."""
        while True:
            url = self._up_server()
            try:
                drawn = self._complete(url, prompt_ids, n, params, seed)
            except _Unreachable as exc:
                self.servers.mark_down(url, str(exc))
                LOG.warning("%s stopped answering (%s): marked down, its request sent to another server", url, exc)
                continue
            except BaseException:
                self.servers.release(url, completed=False)
                raise
            self.servers.release(url)
            return drawn

    def _up_server(self) -> str:
        """A server up, now holding one more request: probing the down ones due, waiting for
        one to come back, up to ``down_timeout_s`` with none up."""
        while True:
            url = self.servers.acquire()
            if url is not None:
                return url
            self._revive_due()
            down_for = self.servers.all_down_for()
            if down_for is not None and down_for > self.settings.down_timeout_s:
                raise ServerError(f"no server has answered for {down_for:.0f} s (rollout.server.down_timeout_s="
                                  f"{self.settings.down_timeout_s:g}): {self.servers.describe_down()}; start them "
                                  "again, then continue the run from its last checkpoint with `temper train --resume`")
            self.servers.wait(min(max(self.servers.next_due_in(), 0.05), 1.0))

    def check_servers(self) -> None:
        """Once a round: probe the down servers due, and ask each server up for its policy
        version (see the module docstring); every answer is counted in :meth:`record`."""
        self._revive_due()
        for url in self.servers.up():
            try:
                version = self._stated_version(url)
            except _Unreachable as exc:
                self.servers.mark_down(url, str(exc), held=False)
                LOG.warning("%s does not answer (%s): marked down", url, exc)
                continue
            self.servers.checked(url, version)
            if version is None or self.served_version is None or version == self.served_version:
                continue
            if version > self.served_version:
                raise ServerError(f"{url} is at policy version {version}, ahead of this run's {self.served_version}: "
                                  "another client changed its weights")
            self.servers.mark_down(url, f"restarted: at policy version {version}, not {self.served_version}", held=False)
            if self.servers.claim(url):
                self._revive(url)

    def _revive_due(self) -> None:
        for url in self.servers.due():
            if self.servers.claim(url):
                self._revive(url)

    def _revive(self, url: str) -> None:
        """The claimed probe of ``url``: when it answers, load the run's weights onto it (unless
        it has them) and put it back in service; otherwise back off."""
        try:
            version = self._stated_version(url)
            if self.vllm is not None:
                found = self.vllm.served(url)
                if found != self.vllm.version:
                    raise _Unreachable(f"at weight version {found}, not {self.vllm.version}; a vLLM server "
                                       "(reload: vllm) is reloaded only with all the others")
            elif self._last_load is not None and (version is None or version != self.served_version):
                self._reload(url, self.served_version or 0, failover=True)  # a server that states no version: always
                version = self.served_version
            elif version != self.served_version:
                raise _Unreachable(f"at policy version {version}, not {self.served_version}, and this run has loaded "
                                   "no weights to give it")
        except (_Unreachable, ServerError) as exc:
            self.servers.probe_failed(url, str(exc))
            LOG.info("%s is still down: %s", url, exc)
            return
        self.servers.bring_back(url, version)
        LOG.warning("%s answers again: back in service at policy version %s", url, version)

    def _stated_version(self, url: str) -> Optional[int]:
        """The policy version ``url`` states for its models (None: it states none, as vLLM)."""
        listed = self._request("GET", "/v1/models", None, url=url, failover=True).get("data") or [{}]
        return listed[0].get("policy_version")

    def record(self) -> dict[str, float]:
        """The servers' state for the step's record (``ServerPool.record``) and the version
        the run loaded last, ``server/expected_version`` (when known)."""
        record = self.servers.record()
        if self.served_version is not None:
            record["server/expected_version"] = self.served_version
        return record

    def _complete(self, url: str, prompt_ids: list[int], n: int, params: SamplingParams, seed: int) -> list[Drawn]:
        body = {"model": self.model, "prompt": prompt_ids, "n": n, "max_tokens": params.max_new_tokens,
                "temperature": 0.0 if params.greedy else params.temperature, "top_p": params.top_p,
                "stop": list(params.stop), "stop_token_ids": list(params.stop_token_ids), "seed": seed,
                "logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True,
                "include_stop_str_in_output": True, "skip_special_tokens": False}
        reply = self._request("POST", "/v1/completions", body, url=url, failover=True)
        version = reply.get("policy_version")
        if version is not None and self.served_version is not None and version < self.served_version:
            raise _Unreachable(f"restarted: it sampled with policy version {version}, not {self.served_version}")
        if version is not None and self.served_version is not None and version != self.served_version:
            raise ServerError(f"{url} sampled with policy version {version}, but version "
                              f"{self.served_version} was loaded last: another client changed its weights")
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        if len(choices) != n:
            raise ServerError(f"{url} answered {len(choices)} choices for n={n}")
        return [parse_choice(c) for c in choices]

    # -- weights -------------------------------------------------------------------------
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Write ``weights`` where the server can read them and have it load them; the server's
        policy version must then be the next one."""
        if not weights or self.settings.reload == "none":
            return
        if self.adapted is not None:
            self._load_adapter(weights)
            return
        if self.settings.weight_transfer == "http":
            self._last_load = partial(self._transfer, weights_payload(weights))
            self._reload_all()
            return
        from safetensors.torch import save_file

        folder = self._folder()
        partial_file = folder / "model.safetensors.partial"
        save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(partial_file))
        os.replace(partial_file, folder / "model.safetensors")  # the server never reads a half-written file
        if self.vllm is not None:
            self.served_version = self.vllm.load_weights(folder)
            return
        self._last_load = partial(self._replay, "/update_weights_from_disk", {"model_path": str(folder)}, False)
        self._reload_all()

    def _load_adapter(self, weights: dict[str, torch.Tensor]) -> None:
        """Write the adapters in ``weights`` and have the server sample with them from now on."""
        from tempering.models.lora import save_adapters

        if self.vllm is not None:
            self.model = self.vllm.load_adapter(lambda folder: save_adapters(self.adapted, weights, folder),
                                                self._folder(), self.settings.adapter_name)
            self.served_version = self.vllm.version
            return
        folder = self._folder() / "adapter"
        save_adapters(self.adapted, weights, folder)
        if self.settings.weight_transfer == "http":
            self._last_load = partial(self._transfer, adapter_payload(folder, self.settings.adapter_name))
        else:  # load_inplace: replace an adapter of that name; vLLM answers in plain text
            self._last_load = partial(self._replay, "/v1/load_lora_adapter", {
                "lora_name": self.settings.adapter_name, "lora_path": str(folder), "load_inplace": True}, True)
        self._reload_all()
        self.model = self.settings.adapter_name

    def _reload_all(self) -> None:
        """Every server up takes the last load at the next version; a server that does not
        answer is marked down (and takes it when brought back)."""
        expected = (self.served_version or 0) + 1
        for url in self.servers.up():
            try:
                self._reload(url, expected, failover=True)
            except _Unreachable as exc:
                self.servers.mark_down(url, str(exc), held=False)
                LOG.warning("%s does not answer (%s): marked down; it takes these weights when it is back", url, exc)
        self.served_version = expected

    def _reload(self, url: str, expected: int, failover: bool) -> None:
        """Replay the last load onto ``url`` at version ``expected`` and check its answer."""
        self._last_load(url, expected, failover)

    def _replay(self, path: str, body: dict, plain: bool, url: str, expected: int, failover: bool) -> None:
        """``url`` loads the folder in ``body`` (without the version) through ``path``."""
        reply = self._request("POST", path, {**body, "version": expected}, plain=plain, url=url, failover=failover)
        self._loaded(reply, url, f"the weights in {body.get('lora_path', body.get('model_path'))}", expected)

    def _transfer(self, payload: Payload, url: str, expected: int, failover: bool) -> None:
        """``url`` takes ``payload`` over HTTP, in chunks (``tempering.rollout.weight_transfer``)."""
        reply = send(self._request, url, payload, expected, self.settings.chunk_bytes, failover)
        self._loaded(reply, url, f"the {payload.kind} sent over HTTP ({len(payload.data)} bytes)", expected)

    def _loaded(self, reply: dict, url: str, what: str, expected: int) -> None:
        """Check ``url``'s answer to loading ``what``: success, at version ``expected``."""
        if reply.get("success") is False:
            raise ServerError(f"{url} could not load {what}: {reply.get('message')}")
        version = reply.get("policy_version", expected)
        if version != expected:
            raise ServerError(f"{url} is at policy version {version} after loading new weights, "
                              f"not {expected}: another client is changing its weights")

    def _folder(self) -> Path:
        """The weights folder, with the model's config and tokenizer written once (a server
        that loads a whole model folder, vLLM or SGLang, finds them)."""
        if self._weights_dir is None:
            configured = self.settings.weights_dir
            folder = Path(configured) if configured else Path(tempfile.mkdtemp(prefix="tempering-weights-"))
            if not configured:  # ours: removed with this generator
                weakref.finalize(self, shutil.rmtree, folder, True)
            folder.mkdir(parents=True, exist_ok=True)
            if self.model_config is not None:
                self.model_config.save_pretrained(folder)
            self.tokenizer.save_pretrained(folder)
            self._weights_dir = folder
        return self._weights_dir

    def close(self) -> None:
        """Stop sampling; unload vLLM's last adapter; stop the server this run launched."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        try:
            if self.vllm is not None and self.launched is None:
                self.vllm.close()
        finally:
            if self.launched is not None:
                self.launched.stop()

    # -- HTTP ----------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Optional[dict | bytes], plain: bool = False,
                 url: Optional[str] = None, failover: bool = False) -> dict:
        """The reply's JSON from ``url`` (default: the first server), retried as the module
        docstring says; a ServerError otherwise. A ``plain`` text reply is read as ``{"message": text}``;
        a bytes ``body`` is sent as it is (``application/octet-stream``).
        With ``failover``, no answer is an :class:`_Unreachable` at once (another server takes it)."""
        s, url = self.settings, url or self.urls[0]
        for attempt in range(s.retries + 1):
            try:
                return self._once(method, url + path, body, plain)
            except _Transient as exc:
                if failover and not exc.answered:
                    raise _Unreachable(str(exc)) from None
                if attempt == s.retries and exc.answered:
                    raise ServerError(f"{method} {url}{path}: {exc} (after {s.retries + 1} tries)") from None
                report = self.launched.exit_report() if self.launched is not None else None
                if attempt == s.retries or report is not None:
                    raise ServerError(f"{method} {url}{path}: no answer after {attempt + 1} tries ({exc}); "
                                      + (report or "is the server running at rollout.server.url?")) from None
                time.sleep(s.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def _once(self, method: str, address: str, body: Optional[dict | bytes], plain: bool = False) -> dict:
        raw = isinstance(body, bytes)
        data = body if raw or body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/octet-stream" if raw else "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(address, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
                raw = response.read()
            return _reply(raw, plain)
        except urllib.error.HTTPError as exc:
            if exc.code == 429 or exc.code >= 500:
                raise _Transient(f"status {exc.code}: {_message(exc)}", answered=True) from None
            raise ServerError(f"{method} {address}: status {exc.code}: {_message(exc)}") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError) as exc:
            raise _Transient(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}") from None
        except json.JSONDecodeError:
            raise _Transient("the reply is not JSON") from None


def _reply(data: bytes, plain: bool) -> dict:
    """A reply body as JSON, or as ``{"message": text}`` where ``plain`` text is expected.

    >>> _reply(b"Success: LoRA adapter 'a' added successfully.", plain=True)
    {'message': "Success: LoRA adapter 'a' added successfully."}
    """
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        if plain:
            return {"message": data.decode(errors="replace")}
        raise


def _message(error: urllib.error.HTTPError) -> str:
    """The server's own words from an error reply (OpenAI's ``{"error": {"message"}}`` shape)."""
    try:
        payload = json.loads(error.read())
    except (ValueError, OSError):
        return error.reason
    found = payload.get("error", payload) if isinstance(payload, dict) else payload
    return found.get("message", str(found)) if isinstance(found, dict) else str(found)
