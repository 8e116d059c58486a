"""The recording endpoint agents call: ``temper serve``'s server, one path per episode.

An episode is opened with :meth:`RecordingServer.open`, which gives it a key; its agent's
OpenAI client is pointed at ``<url>/episodes/<key>/v1``, so every call is attributed to its
episode whatever the agent puts in its requests. Each call is sampled by the current policy
through the server's batcher (concurrent agents share sampler calls) and recorded as
:class:`Call` records: the exact prompt ids the server rendered (the chat template's
rendering of ``messages``, or the ``prompt`` of ``/v1/completions``), the sampled ids and
their log-probs, one record per choice.

The run, not the agent, decides how tokens are drawn, so that the recorded log-probs are
the ones the learner recomputes: the request's ``temperature``, ``top_p``, ``top_k``,
``min_p``, penalties, ``logit_bias`` and ``min_tokens`` are replaced by the run's (greedy in
evaluation, none of the others), its ``max_tokens`` is capped at the run's
``max_new_tokens`` (and the model's context), the run's stop strings join its own, and its
``seed`` is replaced by one drawn for the episode (so an episode replays exactly). The
``model`` it names is ignored. An episode takes at most ``max_calls`` requests; once closed
(its agent returned or timed out), requests to its path are refused with 410.

The sampler is the run's :class:`~tempering.rollout.base.TokenSampler`: the built-in one, or
vLLM in the run's process or on a server (``tempering.rollout.requests``), to which each row
goes as token ids in a request seeded from its call's stream, so the recorded ids and
log-probs are the ones vLLM drew. Those samplers return the sampled tokens' log-probs alone,
so with them a request that wants more is refused (400) rather than answered with something
else: alternatives (``logprobs`` above 0, chat's ``top_logprobs`` above 0) and the prompt's
log-probs (``echo`` with ``logprobs``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Optional

from tempering.rollout.base import SamplingParams, TokenSampler
from tempering.rollout.hf import HFGenerator
from tempering.rollout.openai_api import RequestError, flag, logprobs_asked, sampling_request
from tempering.rollout.server import Job, Server

SAMPLING_PATHS = ("/v1/completions", "/v1/chat/completions")


@dataclass
class Call:
    """One sampled completion an agent asked for, as the policy drew it."""

    request: dict
    """The JSON body the agent sent."""
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str


@dataclass
class Recording:
    """One episode's calls; the sampling settings the run imposes on them."""

    params: SamplingParams
    seed: int
    max_calls: int
    calls: list[Call] = field(default_factory=list)
    requests: int = 0
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_seed(self) -> int:
        """The seed of the episode's next request; a RequestError once it is over or out of calls."""
        with self.lock:
            if self.closed:
                raise RequestError("this episode is over (its agent returned or ran out of time)", 410)
            if self.requests >= self.max_calls:
                raise RequestError(f"this episode has made its {self.max_calls} calls (env.max_turns)")
            self.requests += 1
            return (self.seed + self.requests) % 2**63

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def add(self, calls: list[Call]) -> None:
        with self.lock:
            if not self.closed:  # a late answer to a timed-out episode is not its data
                self.calls += calls


class RecordingServer(Server):
    """:class:`~tempering.rollout.server.Server` whose endpoints live under ``/episodes/<key>``."""

    def __init__(self, sampler: TokenSampler, batch_size: int):
        super().__init__(sampler, "policy", batch_size)
        self._episodes: dict[str, Recording] = {}
        self._lock = threading.Lock()
        self._opened = 0

    def open(self, recording: Recording) -> str:
        """Start recording an episode; returns the key of its path."""
        with self._lock:
            self._opened += 1
            key = f"{self._opened:x}"
            self._episodes[key] = recording
        return key

    def close(self, key: str) -> Recording:
        """Stop recording an episode (its later requests are refused); returns its recording."""
        with self._lock:
            recording = self._episodes.pop(key)
        recording.close()
        return recording

    def route(self, method: str, path: str) -> Optional[Callable]:
        """Only episode paths: the sampling endpoints recorded, the GET ones as they are (no
        weight reload: the run owns the weights)."""
        key, slash, rest = path.removeprefix("/episodes/").partition("/")
        if not path.startswith("/episodes/") or not slash:
            return None
        rest = "/" + rest
        if method == "GET":
            return super().route(method, rest)
        if method == "POST" and rest in SAMPLING_PATHS:
            return partial(super().route(method, rest), sample=partial(self._record, key))
        return None

    def _check_model(self, body: dict) -> None:
        """Any model name: an agent written for another provider names its model."""

    def _record(self, key: str, body: dict, prompts: list[list[int]]) -> Job:
        recording = self._episodes.get(key)
        if recording is None:
            raise RequestError(f"no episode {key} is being recorded (it is over, or never began)", 410)
        self._check_asked(body)
        self.check_prompts(prompts)
        body = _capped(body, recording.params.max_new_tokens, self.sampler.context_length - max(map(len, prompts)))
        asked, n, _ = sampling_request(body, [len(p) for p in prompts], self.sampler.context_length, self.vocab)
        run = recording.params
        params = replace(run, max_new_tokens=asked.max_new_tokens, stop=tuple(dict.fromkeys(asked.stop + run.stop)),
                         stop_token_ids=asked.stop_token_ids)
        job = self.run(prompts, params, n, recording.next_seed(), top=logprobs_asked(body, "messages" in body) or 0)
        rows = [p for p in prompts for _ in range(n)]
        recording.add([Call(body, prompt, ids, logprobs, self.tokenizer.decode(ids, skip_special_tokens=True), reason)
                       for prompt, (ids, logprobs, reason) in zip(rows, job.outputs)])
        return job

    def _check_asked(self, body: dict) -> None:
        """A RequestError for what only the built-in sampler computes: other samplers (vLLM,
        a server) return the sampled tokens' log-probs alone."""
        if isinstance(self.sampler, HFGenerator):
            return
        chat = "messages" in body
        if logprobs_asked(body, chat):
            key = "top_logprobs" if chat else "logprobs"
            raise RequestError(f"'{key}' above 0: this run samples with vLLM or a server (rollout.engine, "
                               "rollout.server), which give each sampled token's log-prob but not the most likely "
                               f"alternatives; ask for {'logprobs: true alone' if chat else 'logprobs: 0'}", param=key)
        if not chat and flag(body, "echo") and body.get("logprobs") is not None:
            raise RequestError("'echo' with 'logprobs': this run samples with vLLM or a server (rollout.engine, "
                               "rollout.server), which does not score prompts here; leave out echo", param="echo")


def _capped(body: dict, limit: int, room: int) -> dict:
    """``body`` asking for at most ``limit`` new tokens (and ``room``, what the context has left,
    when that is positive); a request asking for fewer, or for a malformed number, is left as
    it is (the server answers the latter)."""
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    cap = min(limit, room) if room > 0 else limit
    asked: Any = body.get(key)
    if asked is None or (isinstance(asked, int) and not isinstance(asked, bool) and asked > cap):
        return {**body, key: cap}
    return body
