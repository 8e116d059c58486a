"""builtin:tiny-long: a fixed recipe whose corpus is a length curriculum of the long_context
kinds the shipped long config trains, with room for twice the longest trained length, its own
cache entry, and the model name understood wherever a built-in model is."""

import pytest

from tempering import tiny_long
from tempering.build import BUILTIN_MODELS, check_builtin_name
from tempering.config import ConfigError, PretrainConfig, load_config
from tempering.pretrain import builtin_pretrain, cached_model_dir, corpus
from tempering.tasks import build_task


def test_the_long_config_trains_the_recipes_kinds_and_evaluates_twice_the_longest_length():
    config = load_config("long")
    assert config.model.path == "builtin:tiny-long"
    expected = tiny_long.domains() + [tiny_long.extrapolation()]
    assert [(t.name, t.weight, t.options) for t in config.tasks] == [(t.name, t.weight, t.options) for t in expected]
    assert max(config.tasks[0].options["lengths"]) == tiny_long.LONGEST >= 4096
    assert config.tasks[-1].options["length_tokens"] == 2 * tiny_long.LONGEST


def test_the_recipe_is_a_length_curriculum_over_the_trained_kinds_with_room_to_extrapolate():
    recipe = tiny_long.recipe()
    assert [t.name for t in recipe.tasks] == [f"long_context:{kind}" for kind in tiny_long.CORPUS]
    corpus = {t.name: {k: v for k, v in t.options.items() if k != "corpus_docs"} for t in recipe.tasks}
    assert all(corpus[t.name] == t.options for t in tiny_long.domains())  # RL trains what the corpus wrote
    assert recipe.max_positions >= 2 * tiny_long.LONGEST + 16
    for spec in recipe.tasks:
        assert spec.options["lengths"] == tiny_long.LENGTHS and len(spec.options["corpus_docs"]) == len(tiny_long.LENGTHS)
        task = build_task(spec.name, seed=0, **spec.options)
        stages = [task.corpus_length(i) for i in range(sum(spec.options["corpus_docs"]) + 5)]
        assert stages == sorted(stages) and stages[0] == tiny_long.LENGTHS[0] and stages[-1] == tiny_long.LONGEST
    # the short documents dominate, and each length's documents fill about the steps the recipe counts
    assert tiny_long.DOCS == sorted(tiny_long.DOCS, reverse=True)
    assert recipe.steps == tiny_long.steps() and recipe.batch_tokens > 0


def test_the_corpus_starts_short_and_answers_with_the_stale_value_in_about_its_share():
    documents = corpus(tiny_long.recipe())
    stale = right = 0
    for _ in range(400):
        text = next(documents)
        assert len(text) <= tiny_long.LENGTHS[0] + tiny_long.ANSWER_ROOM
        answer = text.rsplit("answer: ", 1)[1]
        if "was changed to" in text:
            first, latest = (text.split(marker, 1)[1][:4] for marker in (" is ", " was changed to "))
            stale += answer == first
            right += answer == latest
    assert stale + right == 300  # three retrieval documents in four, each answered one of the two ways
    assert abs(stale / 300 - tiny_long.WRONG_SHARE) < 0.1


def test_tiny_long_has_its_own_cache_entry_whatever_the_pretrain_section_says():
    tiny = PretrainConfig()
    assert builtin_pretrain("builtin:tiny-long", tiny) == tiny_long.recipe()
    assert cached_model_dir(tiny_long.recipe()) != cached_model_dir(tiny)
    check_builtin_name("builtin:tiny-long")
    assert "builtin:tiny-long" in BUILTIN_MODELS


def test_a_pretrain_section_beside_tiny_long_is_a_config_error():
    with pytest.raises(ConfigError, match="builtin:tiny-long is pre-trained by its fixed recipe"):
        load_config("long", ["pretrain.steps=5"])


def test_token_budget_steps_hold_the_documents_that_fit_and_are_a_new_cache_entry():
    from tempering.models.tiny import build_tokenizer
    from tempering.pretrain import cache_key, document_batches, document_ids

    tokenizer = build_tokenizer()
    vocab = tokenizer.get_vocab()
    config = tiny_long.recipe().model_copy(update={"batch_tokens": 600})
    batches = document_batches(config, lambda text: document_ids(text, vocab, tokenizer), tokenizer.pad_token_id)
    shapes = [tuple(input_ids_BT.shape) for input_ids_BT, _ in (next(batches) for _ in range(5))]
    assert all(rows * width <= 600 for rows, width in shapes) and all(rows == 2 for rows, _ in shapes)
    assert cache_key(PretrainConfig(batch_tokens=4096)) != cache_key(PretrainConfig())
