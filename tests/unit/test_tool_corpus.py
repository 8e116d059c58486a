"""The built-in model's corpus with calculator calls, and the model cache keys that must not move.

Cached tiny models are found by ``cache_key``; a key that changes for an unchanged corpus
makes every user pre-train again (minutes). The golden keys below are those of the code before
multi-turn environments added ``TaskSpec.env`` and ``PretrainConfig.tool_share`` (and token-budget
steps ``PretrainConfig.batch_tokens``).
"""

import hashlib
import itertools
import json

import pytest

from tempering.config import PretrainConfig
from tempering.envs.tools import calculate
from tempering.models.tiny import CHARACTERS
from tempering.pretrain import CORPUS_VERSION, cache_key, corpus
from tempering.tasks import build_task


def _old_key(config: PretrainConfig) -> str:
    """``cache_key`` as it was written before the multi-turn fields (and ``batch_tokens``, and the
    copy practice's ``schedule``, ``hold_steps``, ``copy_rows`` and ``context_weight``,
    and ``nope_layers`` and ``nope_from_step``) existed."""
    later = ("tool_share", "batch_tokens", "schedule", "hold_steps", "copy_rows", "context_weight", "nope_layers",
             "nope_from_step")
    fields = config.model_dump(mode="json", exclude={**dict.fromkeys(later, True), "tasks": {"__all__": {"env"}}})
    return hashlib.sha256(json.dumps({"v": CORPUS_VERSION, **fields}, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize("fields, golden", [
    ({}, "3e8c2d172d9b4fd7"),
    ({"wrong_share": 0.0, "hidden_size": 384, "heads": 6, "steps": 300}, "1b5a1173aae16da7"),
])
def test_cache_keys_of_configs_without_tools_are_unchanged(fields, golden):
    config = PretrainConfig(**fields)
    assert cache_key(config) == _old_key(config) == golden


def test_a_tool_share_is_a_new_cache_entry():
    keys = {cache_key(PretrainConfig(tool_share=share)) for share in (0.0, 0.2, 0.3)}
    assert len(keys) == 3


def _documents(tool_share: float, n: int) -> list[str]:
    return list(itertools.islice(corpus(PretrainConfig(tool_share=tool_share)), n))


def test_calculator_documents_appear_at_the_share_and_state_the_right_answer():
    documents = _documents(0.3, 1500)
    with_tool = [d for d in documents if "<calc>" in d]
    assert 0.26 <= len(with_tool) / len(documents) <= 0.34
    for document in with_tool:
        expression, call, answer = document.split("\n")
        result = calculate(expression)
        assert call == f"<calc>{expression}</calc><result>{result}</result>"
        assert answer == f"answer: {result}"
    assert {d.split("\n")[0][2] for d in with_tool} == {"+", "-", "*"}, "every arithmetic task calls it"


def test_a_tool_share_only_replaces_documents_and_keeps_to_the_tiny_vocabulary():
    plain, mixed = _documents(0.0, 600), _documents(0.5, 600)
    assert not any("<calc>" in d for d in plain)
    assert all(m == p for p, m in zip(plain, mixed) if "<calc>" not in m)
    assert set("".join(mixed)) <= set(CHARACTERS)


def test_program_style_documents_never_call_the_calculator():
    task = build_task("add", seed=0, style="program")
    assert not any("<calc>" in task.corpus_document(i, 0.0, tool_share=1.0) for i in range(50))


def test_a_task_whose_documents_changed_is_a_new_cache_entry(monkeypatch):
    """A model pre-trained on a task's earlier documents is not found for the same config
    (the code task's level-1 constants grew from 0..9 to 0..99 under unchanged configs)."""
    from tempering.tasks.code import CodeTask

    config = PretrainConfig(tasks=[{"name": "code", "options": {"families": ["at_least"]}}])
    earlier = _old_key(config)
    assert cache_key(config) != earlier
    current = cache_key(config)
    monkeypatch.setattr(CodeTask, "corpus_version", CodeTask.corpus_version + 1, raising=False)
    assert cache_key(config) not in (current, earlier)
