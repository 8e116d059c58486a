"""The OpenAI / vLLM wire format of ``temper serve``: what a request's fields mean, and the
shapes of the answers (choices, log-probs, stream chunks, errors). Pure functions of the
request and the sampler's output; the server (``tempering.rollout.server``) runs the model.

Every sampling field vLLM's OpenAI server takes is applied or refused with a 400 naming it
(:data:`REFUSED`, :func:`sampling_request`); a field vLLM does not know is ignored, as vLLM
ignores it. The log-probs are those of the distribution each token was drawn from (the
temperature-scaled one after any penalties and ``logit_bias``; ``top_k``, ``min_p`` and
``top_p`` decide which tokens can be drawn, not the numbers), vLLM's
``--logprobs-mode processed_logprobs``; a prompt's log-probs (``echo``) are the model's own.

Stop strings: the sampler stops at the token that completes one; the returned text ends
before it (after it with ``include_stop_str_in_output``), while ``token_ids`` and the
log-probs keep every token sampled, the one that completed the stop string included, as vLLM
keeps them; ``stop_reason`` names the string (or the stop token id).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Optional

from tempering.rollout.base import SamplingParams

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
MAX_N = 1024
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
LOWEST_LOGPROB = -9999.0  # what vLLM reports for a log-prob of minus infinity (JSON has no -inf)

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 410: "GoneError",
               411: "BadRequestError", 413: "BadRequestError", 429: "RateLimitError", 500: "InternalServerError",
               501: "NotImplementedError"}


class RequestError(ValueError):
    """A request the client must change; answered with ``status`` (400 unless told) and this
    message, naming the request field ``param`` where one is at fault."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None):
        super().__init__(message)
        self.status, self.param = status, param


def error_body(status: int, message: str, param: Optional[str] = None) -> dict:
    """vLLM's error answer: ``{"error": {"message", "type", "param", "code"}}``, ``code`` the HTTP status."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "BadRequestError"), "param": param,
                      "code": status}}


REFUSED = {
    # field: (the values that change nothing, why another value is refused)
    "suffix": ((None, ""), "is not supported (the server completes after the prompt only)"),
    "use_beam_search": ((None, False), "is not supported: beam search is not done"),
    "length_penalty": ((None, 1, 1.0), "only applies to beam search, which is not done"),
    "allowed_token_ids": ((None,), "is not supported; logit_bias of -100 on the other tokens has that effect"),
    "bad_words": ((None, []), "is not supported"),
    "response_format": ((None, {"type": "text"}), "is not supported beyond {\"type\": \"text\"}: no structured output"),
    "guided_json": ((None,), "is not supported: no structured output"),
    "guided_regex": ((None,), "is not supported: no structured output"),
    "guided_choice": ((None,), "is not supported: no structured output"),
    "guided_grammar": ((None,), "is not supported: no structured output"),
    "structured_outputs": ((None,), "is not supported: no structured output"),
    "logits_processors": ((None,), "is not supported"),
    "prompt_logprobs": ((None,), "is not supported; echo with logprobs gives the prompt's log-probs"),
    "truncate_prompt_tokens": ((None,), "is not supported: send a prompt that fits"),
    "prompt_embeds": ((None,), "is not supported: send text or token ids"),
    "spaces_between_special_tokens": ((None, True), "false is not supported"),
    "chat_template": ((None,), "is not supported: the model's own chat template renders messages"),
    "chat_template_kwargs": ((None, {}), "is not supported: the model's own chat template renders messages"),
    "add_generation_prompt": ((None, True), "false is not supported: the prompt always ends with the assistant's turn"),
    "continue_final_message": ((None, False), "is not supported: the prompt always ends with the assistant's turn"),
    "documents": ((None, []), "is not supported"),
    "logprob_token_ids": ((None, []), "is not supported: ask for 'logprobs' (the most likely tokens at each "
                                      "position, the sampled one's always among them)"),
    "repetition_detection": ((None, {}), "is not supported: repeated n-grams do not end a completion here "
                                         "(max_tokens, stop and stop_token_ids do)"),
    "priority": ((None, 0), "other than 0 is not supported: this server does not schedule by priority (requests "
                            "are sampled in the order they come)"),
    "tool_choice": ((None, "none"), "is not supported beyond \"none\": tool calls are not parsed from the output "
                                    "(the model's text comes back as the message's content)"),
}
CHAT_ONLY = ("chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "documents",
             "tool_choice")


def refuse_unsupported(body: dict, chat: bool) -> None:
    """A RequestError naming the first field set to a value this server cannot honour."""
    for key, (neutral, why) in REFUSED.items():
        if key in body and body[key] not in neutral and (chat or key not in CHAT_ONLY):
            raise RequestError(f"{key!r} {why}", param=key)
    if chat and body.get("echo"):
        raise RequestError("'echo' in chat completions is not supported", param="echo")


def number(body: dict, key: str, default: Any, kind: type, low: float, high: float = float("inf")) -> Any:
    """``body[key]`` (``default`` when absent or null) as ``kind``, within ``[low, high]``."""
    value = body.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise RequestError(f"{key!r} must be a{'n integer' if kind is int else ' number'}, got {value!r}", param=key)
    if not low <= value <= high:
        raise RequestError(f"{key!r}={value} is outside [{low}, {high}]", param=key)
    return kind(value)


def flag(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{key!r} must be true or false, got {value!r}", param=key)
    return value


def _strings(body: dict, key: str) -> tuple[str, ...]:
    value = body.get(key) or []
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise RequestError(f"{key!r} must be a string or a list of non-empty strings", param=key)
    return tuple(dict.fromkeys(value))


def _token_ids(body: dict, key: str, vocab: int) -> tuple[int, ...]:
    value = body.get(key) or []
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                              for t in value):
        raise RequestError(f"{key!r} must be a list of token ids in 0..{vocab - 1}", param=key)
    return tuple(dict.fromkeys(value))


def _logit_bias(body: dict, vocab: int) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` (``{"token id": bias}``, biases clamped to [-100, 100] as vLLM does) as pairs."""
    value = body.get("logit_bias") or {}
    if not isinstance(value, dict):
        raise RequestError("'logit_bias' must map token ids to biases", param="logit_bias")
    pairs = []
    for key, bias in value.items():
        if not str(key).isdigit() or not int(key) < vocab:
            raise RequestError(f"'logit_bias' names {key!r}, not a token id in 0..{vocab - 1}", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise RequestError(f"'logit_bias' of token {key} must be a number, got {bias!r}", param="logit_bias")
        pairs.append((int(key), max(-100.0, min(100.0, float(bias)))))
    return tuple(sorted(pairs))


def sampling_request(body: dict, prompt_lengths: list[int], context: int, vocab: int = 1 << 62
                     ) -> tuple[SamplingParams, int, Optional[int]]:
    """``(params, n, seed)`` of a request (seed None when it names none); a RequestError for a bad or unfittable one.
    ``max_tokens`` may be 0 only with ``echo`` (the prompt's log-probs alone)."""
    remaining = context - max(prompt_lengths) if context else 0
    default_tokens = DEFAULT_MAX_TOKENS if "messages" not in body else max(1, remaining)
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    tokens = number(body, key, default_tokens, int, 0 if body.get("echo") is True else 1)
    if context and tokens > remaining:
        raise RequestError(f"this model's maximum context length is {context} tokens; the prompt ({max(prompt_lengths)} "
                           f"tokens) and {key} ({tokens}) are more", param=key)
    temperature = number(body, "temperature", 1.0, float, 0.0, 100.0)
    top_k = number(body, "top_k", 0, int, -1)
    params = SamplingParams(
        temperature=temperature or 1.0, top_p=number(body, "top_p", 1.0, float, 1e-9, 1.0), max_new_tokens=tokens,
        stop=_strings(body, "stop"), greedy=temperature == 0, top_k=max(0, top_k),
        min_p=number(body, "min_p", 0.0, float, 0.0, 1.0),
        presence_penalty=number(body, "presence_penalty", 0.0, float, -2.0, 2.0),
        frequency_penalty=number(body, "frequency_penalty", 0.0, float, -2.0, 2.0),
        repetition_penalty=number(body, "repetition_penalty", 1.0, float, 1e-6, 100.0),
        logit_bias=_logit_bias(body, vocab), min_tokens=min(tokens, number(body, "min_tokens", 0, int, 0)),
        ignore_eos=flag(body, "ignore_eos"), stop_token_ids=_token_ids(body, "stop_token_ids", vocab))
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"'seed' must be an integer, got {seed!r}", param="seed")
    seed = None if seed is None else seed % 2**63
    n = number(body, "n", 1, int, 1, MAX_N)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise RequestError("'best_of' other than n is not supported: ask for n samples and pick among them",
                           param="best_of")
    return params, n, seed


def logprobs_asked(body: dict, chat: bool) -> Optional[int]:
    """How many alternatives per token the request wants (None: no log-probs); over
    :data:`MAX_LOGPROBS` is refused, as vLLM refuses it."""
    if chat:
        top = body.get("top_logprobs")
        if not flag(body, "logprobs"):
            if top:
                raise RequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
            return None
        return number(body, "top_logprobs", 0, int, 0, MAX_LOGPROBS) if top is not None else 0
    if body.get("logprobs") is None:
        return None
    asked = number(body, "logprobs", 0, int, 0)
    if asked > MAX_LOGPROBS:
        raise RequestError(f"'logprobs'={asked} is over this server's maximum of {MAX_LOGPROBS} (vLLM's "
                           "--max-logprobs default)", param="logprobs")
    return asked


def chat_messages(messages: Any) -> list[dict]:
    """``messages`` as the chat template takes them: ``content`` as text (a list of text parts
    joined with newlines, as vLLM joins them; null, as an assistant turn with ``tool_calls``
    sends it, as empty text)."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", param="messages")
    rendered = []
    for k, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            kinds = {part.get("type") if isinstance(part, dict) else None for part in content}
            if kinds - {"text"} or not all(isinstance(part.get("text"), str) for part in content):
                raise RequestError(f"messages[{k}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                                   f"are supported, got {sorted(map(str, kinds - {'text'})) or 'a part without text'}",
                                   param="messages")
            content = "\n".join(part["text"] for part in content)
        elif content is None and (message.get("tool_calls") or message.get("role") == "assistant"):
            content = ""
        if not isinstance(content, str) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{k}] must have a role and a content (text or a list of text parts)",
                               param="messages")
        rendered.append({**message, "content": content})
    return rendered


@dataclass
class Sampled:
    """One choice as sampled: the prompt, the completion's ids and log-probs, why it ended, and
    per token the alternatives (``(id, log-prob)``, most likely first)."""

    prompt: list[int]
    ids: list[int]
    logprobs: list[float]
    reason: str
    alternatives: list[list[tuple[int, float]]]


class Wire:
    """Turns sampled choices into the answer's JSON for one request (``body``), with the
    served model's ``tokenizer``."""

    def __init__(self, tokenizer: Any, body: dict, params: SamplingParams, top: Optional[int]):
        self.tokenizer, self.body, self.params, self.top = tokenizer, body, params, top
        self.as_ids = flag(body, "return_tokens_as_token_ids")
        self.skip_special = flag(body, "skip_special_tokens", True)
        self.keep_stop = flag(body, "include_stop_str_in_output")

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_ids else self.tokenizer.decode([token_id])

    def completion_text(self, sampled: Sampled) -> tuple[str, Optional[str | int]]:
        """``(text, stop_reason)``: the completion's text up to the stop string that ended it."""
        text = self.text(sampled.ids)
        if sampled.reason != "stop" or not sampled.ids:
            return text, None
        if sampled.ids[-1] in self.params.stop_token_ids:
            return text, sampled.ids[-1]
        found = stop_string_at(text, len(self.text(sampled.ids[:-1])), self.params.stop)
        if found is None:
            return text, None
        start, stop = found
        return text[: start + len(stop)] if self.keep_stop else text[:start], stop

    def entry(self, token_id: int, logprob: Optional[float]) -> tuple[str, Optional[float]]:
        return self.token(token_id), None if logprob is None else max(LOWEST_LOGPROB, logprob)

    def top_dict(self, token_id: int, logprob: float, alternatives: list[tuple[int, float]]) -> dict:
        """vLLM's ``top_logprobs`` entry: the token itself, then its ``top`` most likely alternatives."""
        found = dict([self.entry(token_id, logprob)])
        for alt, lp in alternatives[: self.top]:
            found.setdefault(*self.entry(alt, lp))
        return found

    def completion_logprobs(self, tokens: list[int], logprobs: list[Optional[float]],
                            alternatives: list[Optional[list[tuple[int, float]]]], start: int = 0) -> dict:
        """A ``/v1/completions`` choice's ``logprobs``: the tokens, their log-probs, the top
        alternatives (null where a log-prob is null) and each token's offset in the text."""
        offsets = [start + x for x in accumulate((len(self.tokenizer.decode([t])) for t in tokens), initial=0)]
        tops = [None if lp is None or alt is None else self.top_dict(t, lp, alt)
                for t, lp, alt in zip(tokens, logprobs, alternatives)]
        return {"tokens": [self.token(t) for t in tokens],
                "token_logprobs": [None if lp is None else max(LOWEST_LOGPROB, lp) for lp in logprobs],
                "top_logprobs": tops, "text_offset": offsets[: len(tokens)]}

    def chat_logprobs(self, sampled: Sampled) -> list[dict]:
        """A chat choice's ``logprobs.content``."""
        def item(token_id: int, logprob: float) -> dict:
            token, value = self.entry(token_id, logprob)
            return {"token": token, "logprob": value, "bytes": list(token.encode())}

        return [{**item(t, lp), "top_logprobs": [item(a, alp) for a, alp in alts[: self.top]]}
                for t, lp, alts in zip(sampled.ids, sampled.logprobs, sampled.alternatives)]


def stop_string_at(text: str, before: int, stops: tuple[str, ...]) -> Optional[tuple[int, str]]:
    """``(start, stop string)`` of the stop string that ended ``text``: the first that reaches
    past ``before`` characters (the text before the last token, where the sampler found none).

    >>> stop_string_at("a\\nb\\n c", 3, ("\\n",))
    (3, '\\n')
    >>> stop_string_at("abc", 2, ("x",)) is None
    True
    """
    found = [(i, s) for s in stops if (i := text.find(s, max(0, before - len(s) + 1))) >= 0]
    return min(found) if found else None


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_prompts(prompt: Any, tokenizer: Any, special: bool = True) -> list[tuple[list[int], Optional[str]]]:
    """``(token ids, text or None)`` of each prompt of a ``/v1/completions`` request: text, ids,
    or a list of either; ``special``: tokenize text with the tokenizer's special tokens."""
    if isinstance(prompt, str):
        return [(tokenizer(prompt, add_special_tokens=special)["input_ids"], prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [(list(prompt), None)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [found for p in prompt for found in completion_prompts(p, tokenizer, special)]
    raise RequestError("'prompt' must be text, a list of token ids, or a non-empty list of either", param="prompt")
