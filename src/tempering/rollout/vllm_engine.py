"""Rollouts from ``vllm.LLM`` in this process (``rollout.engine: vllm``), weights updated in memory.

:class:`VllmGenerator` is a :class:`~tempering.rollout.base.Generator` and a
:class:`~tempering.rollout.base.TokenSampler` over a vLLM engine that runs inside the rollout
worker: its engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and its one
worker too (the ``uni`` executor), so no process is spawned and a script that trains with it
needs no ``if __name__ == "__main__"`` guard. The engine starts on the learner's weights as
they are when it is built (saved once to a private folder, which is removed once vLLM has read
it), with the settings of ``tempering.rollout.vllm_launch.engine_flags``: the learner's dtype,
processed log-probs, no chunked prefill on CPU, an explicit KV-cache size, and threads left
unpinned (``VLLM_CPU_OMP_THREADS_BIND=nobind``: pinning would pin the learner's threads too,
which share this process).

New weights go to the worker's ``reload_weights(weights_iterator=...)``: the learner's tensors,
by name, straight into vLLM's model, with no disk round trip (``model.load_weights`` does not
work on CPU, where vLLM repacks linear weights after loading; the reload repeats that). Then the
prefix cache is reset, so no KV block computed with the old weights is reused.

Each problem is one request with ``n = group_size`` and its own seed from the run's stream
(``tempering.rollout.requests``); all of a call's requests go to one ``generate``.

Building the engine changes this process's settings, and puts back what it should not keep:
vLLM's environment variables (``VLLM_*``) stay set (later engines read them), while torch's,
numpy's and Python's random states, ``torch.set_num_threads`` (which vLLM's CPU worker replaces
with a no-op) and the rest of the environment are restored, so the learner's seeding, thread
control and children are unaffected: vLLM's CPU platform sets ``LD_PRELOAD`` (torch's libgomp,
its tcmalloc) for worker processes an in-process engine never starts, and the launch settings
(the ``PYTHONPATH`` of vLLM's processes, ``OMP_NUM_THREADS``, offline flags) are for the
engine's start only; left set, every later child of the run (a ``temper`` subprocess, a
grading process) would load OpenMP before it could make its threads sleep rather than spin.

vLLM's CPU attention checks that a step runs on as many OpenMP threads as it planned for, and a
thread's OpenMP count is its own: a call from a thread other than the one that built the engine
(an agent's recording server samples on its batcher's thread), which starts with OpenMP's
default (the cores), first sets its own count to the builder's.

Not done: LoRA adapters (use ``rollout.server.launch: vllm``), tensor parallelism.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from tempering.checkpoint import restore_rng, rng_state
from tempering.rollout.base import SamplingParams
from tempering.rollout.prompts import use_chat_template
from tempering.rollout.requests import Drawn, RequestSampler
from tempering.rollout.vllm_launch import VllmSettings, environment

IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def _engine(folder: Path, settings: VllmSettings) -> Any:
    """A ``vllm.LLM`` on the model in ``folder``, leaving this process's random state, torch's
    thread control and its environment but for ``VLLM_*`` as they were."""
    environ = dict(os.environ)
    os.environ.update({**environment(settings), **IN_PROCESS})
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # not a line per reload in the run's output
    from vllm import LLM

    rng, set_threads = rng_state(), torch.set_num_threads
    try:
        return LLM(model=str(folder), dtype=settings.dtype, seed=settings.seed, enforce_eager=not settings.compile,
                   logprobs_mode="processed_logprobs", enable_chunked_prefill=not settings.cpu,
                   kv_cache_memory_bytes=int(settings.kv_cache_gib * 2**30), distributed_executor_backend="uni")
    finally:
        restore_rng(rng)
        torch.set_num_threads = set_threads
        _restore_environment(environ)


def _restore_environment(environ: dict[str, str]) -> None:
    """``os.environ`` back to ``environ``, keeping the ``VLLM_*`` variables set since."""
    for key in [key for key in os.environ if key not in environ and not key.startswith("VLLM_")]:
        del os.environ[key]
    os.environ.update({key: value for key, value in environ.items() if not key.startswith("VLLM_")})


class VllmGenerator(RequestSampler):
    """Samples with ``vllm.LLM`` in this process (see the module docstring), starting from
    ``model``'s weights; ``tokenizer`` is the model's."""

    def __init__(self, model: Any, tokenizer: Any, settings: VllmSettings, chat_template: Optional[bool] = None):
        from tempering.checkpoint import save_model

        folder = Path(tempfile.mkdtemp(prefix="tempering-vllm-"))
        try:
            save_model(model, tokenizer, folder / "model")
            self.llm = _engine(folder / "model", settings)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.tokenizer = tokenizer
        self.chat_template = use_chat_template(tokenizer, chat_template)
        self.context_length = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        self.batch_size = sys.maxsize  # vLLM schedules every request of a call itself
        self.threads = torch.get_num_threads()  # this thread's, which vLLM's steps plan for

    def _same_threads(self) -> None:
        """This thread on the engine builder's OpenMP thread count (see the module docstring)."""
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def _complete_all(self, prompts: list[list[int]], n: int, params: SamplingParams,
                      seeds: list[int]) -> list[list[Drawn]]:
        from vllm import SamplingParams as VllmParams
        from vllm.inputs import TokensPrompt

        self._same_threads()
        requests = [VllmParams(n=n, temperature=0.0 if params.greedy else params.temperature, top_p=params.top_p,
                               max_tokens=params.max_new_tokens, stop=list(params.stop),
                               stop_token_ids=list(params.stop_token_ids), seed=seed, logprobs=0,
                               include_stop_str_in_output=True, skip_special_tokens=False)
                    for seed in seeds]
        replies = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], requests, use_tqdm=False)
        return [[_drawn(c) for c in sorted(reply.outputs, key=lambda c: c.index)] for reply in replies]

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy ``weights`` (the learner's state dict, by name) into vLLM's model, then drop
        every cached prefix block."""
        if not weights:
            return
        self._same_threads()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache after new weights (requests were running)")

    def close(self) -> None:
        """Shut the engine down (its KV cache and model are freed with it)."""
        self.llm.llm_engine.engine_core.shutdown()


def _drawn(completion: Any) -> Drawn:
    """``(token ids, log-probs, "stop" | "length")`` of one vLLM completion."""
    ids = list(completion.token_ids)
    logprobs = [float(step[token].logprob) for token, step in zip(ids, completion.logprobs)]
    return ids, logprobs, "length" if completion.finish_reason == "length" else "stop"
