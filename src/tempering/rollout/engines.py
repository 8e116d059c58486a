"""Config -> sampler: which engine samples a run's rollouts, and how vLLM is started for it.

``rollout.server`` set: a :class:`~tempering.rollout.remote.ServerGenerator` over it, the
server first launched here with ``launch: vllm``; else ``rollout.engine: vllm``: vLLM in this
process (:class:`~tempering.rollout.vllm_engine.VllmGenerator`); else the built-in sampler
over the learner's model. What each cannot do with this config (vLLM not installed, LoRA
in-process, several URLs to launch one server on, a server that cannot be reached) is a
:class:`~tempering.config.ConfigError` naming the key.

Not here: playing tasks as episodes around the sampler (``tempering.build`` wraps it with
``tempering.envs``) or the rollout worker that draws groups from it (``tempering.pipeline``).
"""

from __future__ import annotations

from tempering.config import ConfigError, TrainConfig
from tempering.models.device import resolve_device
from tempering.rollout.base import Generator
from tempering.rollout.hf import HFGenerator
from tempering.rollout.remote import ServerError, ServerGenerator, ServerSettings
from tempering.rollout.vllm_engine import VllmGenerator
from tempering.rollout.vllm_launch import LaunchedServer, VllmSettings, launch, vllm_missing


def build_sampler(config: TrainConfig, model, tokenizer, batch_size: int, bf16: bool = False,
                  share: bool = True) -> Generator:
    """The sampler: the ``rollout.server`` when one is set, ``vllm.LLM`` with ``rollout.engine:
    vllm``, else the built-in one over ``model``."""
    if config.rollout.server is not None:
        return server_generator(config, model, tokenizer)
    if config.rollout.engine == "vllm":
        settings = vllm_settings(config)
        try:
            return VllmGenerator(model, tokenizer, settings, config.model.chat_template)
        except Exception as exc:  # vLLM's own refusal (cache size, head size, memory), said as a config error
            raise ConfigError(f"rollout.engine=vllm: vLLM could not start on this model: "
                              f"{type(exc).__name__}: {exc}") from exc
    return builtin_sampler(config, model, tokenizer, batch_size, bf16, share)


def builtin_sampler(config: TrainConfig, model, tokenizer, batch_size: int, bf16: bool = False,
                    share: bool = True) -> HFGenerator:
    """The built-in sampler over ``model``."""
    return HFGenerator(model, tokenizer, config.model.chat_template, batch_size, bf16, share=share,
                       onednn=config.rollout.onednn)


def server_generator(config: TrainConfig, model, tokenizer) -> ServerGenerator:
    """A generator over ``rollout.server`` (started first with ``launch``); a ConfigError when it
    cannot be used, started or reached."""
    sc = config.rollout.server
    launched = launch_server(config, model, tokenizer) if sc.launch == "vllm" else None
    url = (sc.url if isinstance(sc.url, str) else tuple(sc.url)) if launched is None else launched.url
    reload = "vllm" if launched is not None and sc.reload != "none" else sc.reload
    settings = ServerSettings(url, sc.model, sc.timeout_s, sc.retries, sc.backoff_s, sc.concurrency,
                              sc.weights_dir, reload, down_timeout_s=sc.down_timeout_s, probe_s=sc.probe_s,
                              max_probe_s=sc.max_probe_s, weight_transfer=sc.weight_transfer,
                              chunk_bytes=int(sc.chunk_mib * (1 << 20)))
    try:
        return ServerGenerator(settings, tokenizer, model.config, config.model.chat_template,
                               adapted=model if config.model.lora is not None else None, launched=launched)
    except BaseException as exc:
        if launched is not None:  # whatever stopped the generator, the server this run started goes with it
            launched.stop()
        if isinstance(exc, ServerError):
            raise ConfigError(f"rollout.server.url={sc.url}: {exc}") from None
        raise


def uses_vllm(config: TrainConfig) -> bool:
    """Whether rollouts come from vLLM that this run starts (in-process or launched)."""
    sc = config.rollout.server
    return sc.launch == "vllm" if sc is not None else config.rollout.engine == "vllm"


def vllm_settings(config: TrainConfig) -> VllmSettings:
    """How vLLM runs for this config (``rollout.vllm``); a ConfigError when it is not installed."""
    key = "rollout.server.launch" if config.rollout.server is not None else "rollout.engine"
    if key == "rollout.server.launch" and not isinstance(config.rollout.server.url, str):
        raise ConfigError("rollout.server.url: launch: vllm starts one server; give one URL, its host and port "
                          "(port 0: a free one)")
    missing = vllm_missing()
    if missing is not None:
        raise ConfigError(f"{key}=vllm: {missing}")
    if key == "rollout.engine" and config.model.lora is not None:
        raise ConfigError("rollout.engine=vllm does not sync LoRA adapters; with model.lora use "
                          "rollout.server={url: 'http://127.0.0.1:0', launch: vllm}")
    vc = config.rollout.vllm
    on_cpu = resolve_device(config.model.device).type == "cpu"
    return VllmSettings(vc.dtype or config.model.dtype, vc.kv_cache_gib, vc.threads or config.threads, vc.cpu_bind,
                        vc.compile, config.seed, on_cpu, vc.start_timeout_s, tuple(vc.args))


def launch_server(config: TrainConfig, model, tokenizer) -> LaunchedServer:
    """vLLM serving the learner's weights as they are now (``rollout.server.launch: vllm``)."""
    settings = vllm_settings(config)
    lora_rank = config.model.lora.rank if config.model.lora is not None else 0
    try:
        return launch(model, tokenizer, config.rollout.server.url, settings, lora_rank)
    except RuntimeError as exc:
        raise ConfigError(f"rollout.server.launch=vllm: {exc}") from None
