"""Rollouts: groups of completions sampled with their exact token ids, log-probs and policy version.

``base`` holds the :class:`~tempering.rollout.base.Generator` protocol every sampler keeps,
``hf`` the built-in sampler over a transformers model (``fast_llama``: its fused decoder for
Llama models), ``prompts`` how prompts are rendered and fitted, ``remote`` a generator over an
OpenAI-compatible server (vLLM, SGLang, ``temper serve``), ``server`` that server over the
built-in sampler, ``vllm_launch`` / ``vllm_engine`` vLLM as a launched server or in-process, and
``engines`` which of these a config asks for.

Not here: scoring (``tempering.rewards``), multi-turn episodes (``tempering.envs`` wraps a
generator), which problems are sampled (``tempering.scheduler``) or where samplers run
(``tempering.pipeline``, ``tempering.placement``).
"""
