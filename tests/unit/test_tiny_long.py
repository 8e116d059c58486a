"""builtin:tiny-long: a fixed recipe whose corpus is a length curriculum of the long_context
kinds the shipped long config trains, with room for twice the longest trained length, its own
cache entry, and the model name understood wherever a built-in model is."""

import pytest

from tempering import tiny_long
from tempering.config import ConfigError, PretrainConfig, load_config
from tempering.policy import BUILTIN_MODELS, check_builtin_name
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
    corpus = {t.name: {k: v for k, v in t.options.items() if k not in ("corpus_docs", "lengths")} for t in recipe.tasks}
    # RL trains what the corpus wrote, at its lengths and one more: the longest is left to RL
    assert all(corpus[t.name] == {k: v for k, v in t.options.items() if k != "lengths"} for t in tiny_long.domains())
    assert all(t.options["lengths"] == tiny_long.PRETRAINED + [tiny_long.LONGEST] for t in tiny_long.domains())
    assert recipe.max_positions >= 2 * tiny_long.LONGEST + 16
    for spec in recipe.tasks:
        assert spec.options["lengths"] == tiny_long.PRETRAINED and len(spec.options["corpus_docs"]) == len(tiny_long.PRETRAINED)
        task = build_task(spec.name, seed=0, **spec.options)
        stages = [task.corpus_length(i) for i in range(sum(spec.options["corpus_docs"]) + 5)]
        assert stages == sorted(stages) and stages[0] == tiny_long.LENGTHS[0] and stages[-1] == tiny_long.PRETRAINED[-1] < tiny_long.LONGEST
    # the short documents dominate, and each length's documents fill about the steps the recipe counts
    assert tiny_long.DOCS == sorted(tiny_long.DOCS, reverse=True)
    assert recipe.steps == tiny_long.steps() and recipe.batch_tokens > 0


def test_the_corpus_starts_short_and_answers_every_retrieval_with_the_latest_value():
    documents = corpus(tiny_long.recipe())
    latest = 0
    for _ in range(400):
        text = next(documents)
        assert len(text) <= tiny_long.LENGTHS[0] + tiny_long.ANSWER_ROOM and "was changed to" in text
        latest += text.rsplit("answer: ", 1)[1] == text.split(" was changed to ", 1)[1][:4]
    assert latest == 400  # WRONG_SHARE 0: with stale answers in the corpus the lookup did not form


def test_the_recipe_practises_copying_at_its_peak_rate_through_the_shortest_documents_with_the_loss_on_the_answer():
    recipe = tiny_long.recipe()
    assert (recipe.copy_rows, recipe.context_weight) == (tiny_long.COPY_ROWS, tiny_long.CONTEXT_WEIGHT)
    assert recipe.copy_rows > 0 and 0 < recipe.context_weight < 1
    first = -(-tiny_long.DOCS[0] // (tiny_long.BATCH_TOKENS // (tiny_long.LENGTHS[0] + tiny_long.ANSWER_ROOM)))
    assert recipe.hold_steps == tiny_long.DROP_AT < tiny_long.stage_steps()[0] == first and recipe.schedule == "cosine"


def test_the_recipes_last_layer_drops_its_positions_at_the_peak_rate_inside_the_shortest_documents():
    recipe = tiny_long.recipe()
    assert recipe.nope_layers == [recipe.layers - 1] and recipe.nope_from_step == tiny_long.DROP_AT
    # the lookup forms with positions by about step 2,000 and relearns without them at 256 before the long lengths
    assert 2000 < recipe.nope_from_step < tiny_long.stage_steps()[0]


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


def _tokens():
    from tempering.models.tiny import build_tokenizer
    from tempering.pretrain import document_ids

    tokenizer = build_tokenizer()
    vocab = tokenizer.get_vocab()
    return tokenizer, lambda text: document_ids(text, vocab, tokenizer)


def test_copy_rows_repeat_a_string_in_a_batch_of_their_own_seeded_by_the_config():
    from tempering.pretrain import COPIED, copy_batches

    tokenizer, token_ids = _tokens()
    id_to_char = {i: c for c, i in tokenizer.get_vocab().items()}
    config = PretrainConfig(copy_rows=3, seed=4)
    input_ids_BT, labels_BT = next(copy_batches(config, token_ids, tokenizer.pad_token_id))
    assert input_ids_BT.shape[0] == 3
    for ids, labels in zip(input_ids_BT.tolist(), labels_BT.tolist()):
        kept = [i for i, label in zip(ids, labels) if label != -100]
        text = "".join(id_to_char[i] for i in kept[1:-1])  # between begin and end
        copied = text.split(".")[0]
        assert 4 <= len(copied) <= 16 and set(copied) <= set(COPIED) and text.endswith(f". {copied}")
    again = next(copy_batches(config, token_ids, tokenizer.pad_token_id))[0]
    other = next(copy_batches(config.model_copy(update={"seed": 5}), token_ids, tokenizer.pad_token_id))[0]
    assert again.equal(input_ids_BT) and not (other.shape == again.shape and other.equal(again))
    assert next(copy_batches(PretrainConfig(), token_ids, tokenizer.pad_token_id)) is None


def test_the_step_loss_weighs_the_context_by_context_weight_over_documents_and_copy_rows_together():
    import torch

    from tempering.pretrain import breaks_of, fresh_model, padded, step_loss

    config = PretrainConfig(hidden_size=32, layers=1, heads=2, bf16=False)
    model, tokenizer, token_ids = fresh_model(config)
    documents = padded([token_ids("a b answer: 1234"), token_ids("c answer: 77")], tokenizer.pad_token_id)
    copies = padded([token_ids("AB12. river. AB12")], tokenizer.pad_token_id)

    def nll_sums(batch, answer_tokens):
        """Each row's summed NLL over its last ``answer_tokens`` targets (value and end, after
        the last space), and over the rest, with both counts."""
        input_ids_BT, labels_BT = batch
        logprobs_BTV = torch.log_softmax(model(input_ids=input_ids_BT).logits[:, :-1], -1)
        nll_BT = -logprobs_BTV.gather(-1, input_ids_BT[:, 1:, None])[..., 0]
        for row, n in enumerate(answer_tokens):
            kept = int((labels_BT[row, 1:] != -100).sum())
            yield float(nll_BT[row, kept - n:kept].sum()), float(nll_BT[row, :kept - n].sum()), n, kept - n

    with torch.no_grad():
        rows = [*nll_sums(documents, [5, 3]), *nll_sums(copies, [5])]
        for weight in (0.0, 0.25):
            expected = (sum(a + weight * c for a, c, _, _ in rows)
                        / sum(n + weight * m for _, _, n, m in rows))
            got = step_loss(model, config.model_copy(update={"context_weight": weight}), [documents, copies],
                            breaks_of(tokenizer))
            assert abs(float(got) - expected) < 1e-5
        plain = step_loss(model, config, [documents, None], breaks_of(tokenizer))
        assert abs(float(plain) - float(model(input_ids=documents[0], labels=documents[1]).loss)) < 1e-6


def test_the_copy_practice_fields_keep_old_cache_keys_at_their_defaults_and_make_new_entries_otherwise():
    from tempering.pretrain import cache_key

    keys = {cache_key(PretrainConfig(**change)) for change in (
        {}, {"schedule": "constant"}, {"hold_steps": 3}, {"copy_rows": 4}, {"context_weight": 0.05})}
    assert len(keys) == 5
    assert cache_key(PretrainConfig(schedule="cosine", hold_steps=0, copy_rows=0, context_weight=1.0)
                     ) == cache_key(PretrainConfig())


def test_a_constant_schedule_keeps_the_peak_rate_to_the_last_step_where_cosine_falls_to_a_tenth_after_its_hold():
    from tempering.pretrain import fresh_model, optimizer_and_schedule

    config = PretrainConfig(hidden_size=32, layers=1, heads=2, steps=20, warmup_steps=2, lr=1e-3)
    model, _, _ = fresh_model(config)
    for change, peak_until in (({"schedule": "constant"}, 20), ({}, 2), ({"hold_steps": 8}, 10)):
        optimizer, scheduler = optimizer_and_schedule(model, config.model_copy(update=change))
        rates = []
        for _ in range(config.steps + 1):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        assert rates[1:peak_until + 1] == [1e-3] * peak_until, change  # step 0 is warm-up's first half
        assert all(later < 1e-3 for later in rates[peak_until + 1:]), change
        assert abs(rates[-1] - (1e-3 if change.get("schedule") else 1e-4)) < 1e-9, change

