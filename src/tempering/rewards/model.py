"""The ``model`` preference reward: score completions with a sequence-classification model.

Any Hugging Face ``AutoModelForSequenceClassification`` with one output (a scalar head)
works: a model directory (such as one ``temper rm train`` saved), a hub id or a ``.gguf``
file. A config may also name ``builtin:tiny`` (the built-in tiny model with a new, untrained
head) or a run folder: the builder resolves those into a folder first
(``tempering.build.reward_model_path``), so this module only loads. The model reads the
prompt followed by the completion, exactly as :func:`reward_text` writes it, and its output
on the last token is the score.

Not done here: pairwise (judge-style) models, generative reward models, sharding a reward
model over several devices.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Literal, Sequence

import torch

from tempering.rewards.base import RewardResult, register_reward
from tempering.types import Problem, Prompt, Rollout


def reward_text(prompt: Prompt, completion: str, tokenizer: Any) -> str:
    """The text a reward model reads: the prompt then the completion.

    Raw prompts are followed directly by the completion (as the policy saw them); chat
    prompts are rendered with the tokenizer's chat template and the completion as the
    assistant's turn, or as plain lines when the tokenizer has none.
    """
    if isinstance(prompt, str):
        return prompt + completion
    messages = list(prompt) + [{"role": "assistant", "content": completion}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n".join(m["content"] for m in messages)


def load_reward_model(path: str, dtype: torch.dtype = torch.float32,
                      head: Literal["sequence", "token"] = "sequence") -> tuple[Any, Any]:
    """``(model, tokenizer)`` with a one-output classification head; a new head if the
    checkpoint has none (the base for ``temper rm train``). ``path`` is a folder, a ``.gguf``
    file or a hub id (see the module docstring). ``head="token"`` puts the output on every
    token (``AutoModelForTokenClassification``), as a process reward model reads each step."""
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer

    from tempering.models.loading import ModelLoadError

    kwargs: dict[str, Any] = {"num_labels": 1, "dtype": dtype}
    location = path
    if path.endswith(".gguf"):
        location, kwargs["gguf_file"] = str(Path(path).parent), Path(path).name
    elif Path(path).exists():
        kwargs["local_files_only"] = True
    elif path.startswith(("/", ".", "~")):
        raise ModelLoadError(f"reward model path {path} does not exist")
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # a new head is expected for a base model
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **{k: v for k, v in kwargs.items()
                                                                if k in ("gguf_file", "local_files_only")})
        auto = AutoModelForTokenClassification if head == "token" else AutoModelForSequenceClassification
        model = auto.from_pretrained(location, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load reward model {path!r}: {exc}") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def sequence_scores(model: Any, tokenizer: Any, texts: Sequence[str], max_length: int) -> torch.Tensor:
    """The model's scalar output for each text, right-padded in one forward pass."""
    tokenizer.padding_side = "right"
    encoded = tokenizer(list(texts), return_tensors="pt", padding=True, truncation=True, max_length=max_length)
    device = next(model.parameters()).device
    return model(**{k: v.to(device) for k, v in encoded.items() if k != "token_type_ids"}).logits[:, 0].float()


@register_reward("model")
class ModelReward:
    """Scores a batch at a time with a reward model kept on ``device``.

    ``path``: the model. ``transform``: ``sigmoid`` maps the score to (0, 1) so it mixes with
    0/1 rewards; ``raw`` keeps the logit. ``device``: empty = CUDA when available, else CPU.
    """

    def __init__(self, *, path: str, batch_size: int = 32, device: str = "",
                 transform: Literal["sigmoid", "raw"] = "sigmoid", max_length: int = 1024):
        if transform not in ("sigmoid", "raw"):
            raise ValueError(f"transform must be 'sigmoid' or 'raw', got {transform!r}")
        self.batch_size, self.transform, self.max_length = batch_size, transform, max_length
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model, self.tokenizer = load_reward_model(path)
        self.model.to(self.device).eval()
        self._lock = threading.Lock()

    @torch.inference_mode()
    def score_batch(self, problems: Sequence[Problem], rollouts: Sequence[Rollout]) -> list[RewardResult]:
        texts = [reward_text(p.prompt, r.text, self.tokenizer) for p, r in zip(problems, rollouts)]
        scores: list[float] = []
        with self._lock:
            for start in range(0, len(texts), self.batch_size):
                logits = sequence_scores(self.model, self.tokenizer, texts[start:start + self.batch_size],
                                         self.max_length)
                values = torch.sigmoid(logits) if self.transform == "sigmoid" else logits
                scores += values.tolist()
        return [RewardResult(s) for s in scores]
