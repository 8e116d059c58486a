"""Streamed answers of ``temper serve`` (``stream: true``): server-sent events sent as the
sampler draws each token, vLLM's chunk shapes.

A choice's text goes out as far as it is settled: a token whose bytes do not yet make a whole
character, and the last characters that could still begin a stop string, wait for the next
token (a stop string is cut from the text, so they may never be sent). The last chunk of a
choice carries what is left of its text and its finish reason, so the chunks' texts joined
are the text the same request gets unstreamed, and every token's log-probs come in the chunk
that carries it.

With ``stream_options: {"include_usage": true}`` a usage chunk ends the stream; with
``continuous_usage_stats`` as well, every chunk carries its choice's usage so far (the
prompt's tokens and the choice's completion tokens), as vLLM's do.
"""

from __future__ import annotations

import json
import queue
from dataclasses import dataclass
from typing import Iterator, Optional

from tempering.httpd import ClientGone, client_gone
from tempering.rollout.batcher import POLL_S, Job
from tempering.rollout.openai_api import RequestError, Sampled, Wire, error_body, flag, usage


@dataclass
class Streamed:
    """An answer sent as server-sent events, each as it is made, for ``job``."""

    events: Iterator[bytes]
    job: Job

    def close(self) -> None:
        """Stop the stream; the job is dropped if it is not done (its client will not read it)."""
        self.events.close()
        if not self.job.done.is_set():
            self.job.cancelled = True


class ChoiceStream:
    """One choice of a streamed answer: its chunks (the ``choices[0]`` fields), made token by token."""

    def __init__(self, wire: Wire, chat: bool, prompt_tokens: int, offset: int = 0):
        self.wire, self.chat, self.prompt_tokens = wire, chat, prompt_tokens
        self.offset = offset  # where the next token starts in the choice's text (the echoed prompt's length)
        self.ids: list[int] = []
        self.sent = ""  # the text sent so far
        self._hold = max(map(len, wire.params.stop), default=1) - 1

    def usage(self) -> dict:
        return usage(self.prompt_tokens, len(self.ids))

    def _settled(self) -> str:
        """The text so far less what a later token may still change."""
        text = self.wire.text(self.ids).rstrip("\ufffd")  # bytes of a character not yet whole
        return text[: max(0, len(text) - self._hold)]

    def token(self, token_id: int, logprob: float, alternatives: list[tuple[int, float]], last: bool = False) -> dict:
        """The chunk of a newly drawn token: the text it settles (none when it is the ``last``,
        which may have completed a stop string: the final chunk has the rest), and its
        log-probs when asked for."""
        self.ids.append(token_id)
        settled = "" if last else self._settled()
        delta = settled[len(self.sent):] if settled.startswith(self.sent) else ""
        self.sent += delta
        wire = self.wire
        if self.chat:
            entries = None if wire.top is None else wire.chat_logprobs(Sampled([], [token_id], [logprob], "", [alternatives]))
            return {"delta": {"content": delta}, "logprobs": None if entries is None else {"content": entries},
                    "finish_reason": None}
        logprobs = (None if wire.top is None else
                    wire.completion_logprobs([token_id], [logprob], [alternatives], self.offset))
        self.offset += len(wire.tokenizer.decode([token_id]))
        return {"text": delta, "logprobs": logprobs, "finish_reason": None, "stop_reason": None,
                "token_ids": [token_id]}

    def finish(self, sampled: Sampled) -> list[dict]:
        """The chunks of the tokens not streamed yet (a sampler that gives them only at the end),
        then the last chunk: the rest of the text, the finish and stop reasons."""
        rest = list(zip(sampled.ids, sampled.logprobs, sampled.alternatives))[len(self.ids):]
        chunks = [self.token(t, lp, alts, last=k == len(rest) - 1) for k, (t, lp, alts) in enumerate(rest)]
        text, stop_reason = self.wire.completion_text(sampled)
        rest = text[len(self.sent):]
        if self.chat:
            chunks.append({"delta": {"content": rest} if rest else {}, "logprobs": None,
                           "finish_reason": sampled.reason, "stop_reason": stop_reason})
        else:
            chunks.append({"text": rest, "logprobs": None, "finish_reason": sampled.reason,
                           "stop_reason": stop_reason, "token_ids": []})
        return chunks


def usage_options(body: dict) -> tuple[bool, bool]:
    """``(include_usage, continuous_usage_stats)`` of a streamed request (the second only with the first, as vLLM)."""
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object", param="stream_options")
    include = flag(options, "include_usage")
    continuous = flag(options, "continuous_usage_stats")
    return include, include and continuous


def stream(job: Job, head: dict, chat: bool, choices: list[ChoiceStream], first: list[Optional[dict]],
           include_usage: bool, continuous: bool) -> Iterator[bytes]:
    """The events of ``job``'s answer as it is sampled: each choice's ``first`` chunk (the
    assistant's role, an echoed prompt; None: none), a chunk per token as the sampler hands
    them over, each choice's last chunk once the job is done, the usage chunk when asked for,
    then ``[DONE]``. A client that hangs up is :class:`ClientGone`, seen while waiting for a
    step and after each (the sender then closes the :class:`Streamed`, dropping the job)."""
    head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}

    def event(index: int, fields: dict) -> bytes:
        chunk = {**head, "choices": [{"index": index, **fields}]}
        if continuous:
            chunk["usage"] = choices[index].usage()
        return f"data: {json.dumps(chunk)}\n\n".encode()

    for index, fields in enumerate(first):
        if fields is not None:
            yield event(index, fields)
    while job.events is not None:
        try:
            step = job.events.get(timeout=POLL_S)
        except queue.Empty:
            if job.done.is_set() and job.events.empty():
                break
            if client_gone():
                raise ClientGone() from None
            continue
        for row, token, logprob, alternatives, ended in step:
            yield event(row, choices[row].token(token, logprob, alternatives, ended))
        if client_gone():  # a write can succeed into the socket's buffer after the client left
            raise ClientGone()
    job.done.wait()
    if job.error is not None:
        status = job.error.status if isinstance(job.error, RequestError) else 500
        yield f"data: {json.dumps(error_body(status, str(job.error)))}\n\n".encode()
    else:
        for index, (choice, sampled) in enumerate(zip(choices, job.sampled())):
            for fields in choice.finish(sampled):
                yield event(index, fields)
        if include_usage:
            completion_tokens = sum(len(ids) for ids, _, _ in job.outputs)
            chunk = {**head, "choices": [], "usage": usage(job.prompt_tokens, completion_tokens)}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"
