"""The consistency reward: cites checked against the task's own document, combined with the outcome."""

import pytest

from tempering.rewards import build_reward
from tempering.rewards.consistency import consistency
from tempering.tasks import build_task
from tempering.types import Problem, Rollout


def _problem(kind="consistency", cite="quote", index=0, **options):
    task = build_task("long_context", seed=0, kind=kind, cite=cite, length_tokens=1024, **options)
    return task.train_problem(index)


def _cite(problem, indices, by="quote"):
    sentences = problem.meta["sentences"]
    lines = [f'cite: "{sentences[i]}"' if by == "quote" else f"cite: {i + 1}" for i in indices]
    return "\n".join(lines + [f"answer: {problem.answer}"])


@pytest.mark.parametrize("kind, options", [("retrieval", {"updates": 1, "near_misses": 2}),
                                           ("multihop", {"hops": 3, "near_misses": 3}),
                                           ("consistency", {"updates": 2, "near_misses": 2})])
@pytest.mark.parametrize("by", ["quote", "line"])
def test_an_answer_citing_exactly_its_evidence_scores_one(kind, options, by):
    problem = _problem(kind, cite=by, **options)
    result = consistency(problem, _cite(problem, problem.meta["evidence"], by))
    assert result.score == 1.0 and result.components["exact"] == 1.0 and result.diagnostics["cites"] >= 1


def test_a_decoy_cited_for_the_answer_costs_grounding():
    problem = _problem(updates=2, near_misses=2)
    evidence, decoys = problem.meta["evidence"], problem.meta["decoys"]
    swapped = consistency(problem, _cite(problem, evidence[1:] + decoys[:1]))
    assert swapped.components["decoys"] == pytest.approx(1 / len(evidence))
    assert swapped.components["precision"] == swapped.components["recall"] == pytest.approx(1 - 1 / len(evidence))
    assert swapped.score < 1.0 and swapped.components["exact"] == 0.0


def test_a_right_answer_without_cites_is_paid_for_the_outcome_alone():
    problem = _problem()
    bare = f"answer: {problem.answer}"
    assert consistency(problem, bare).score == 0.5
    assert consistency(problem, bare, combine="gate").score == 0.0
    assert consistency(problem, bare, combine="grounding").score == 0.0
    assert consistency(problem, bare, weight=0.0).score == 1.0  # weight 0: outcome only


def test_grounding_is_paid_even_when_the_sum_is_wrong_but_not_under_gate():
    problem = _problem(updates=1)
    wrong = _cite(problem, problem.meta["evidence"]).replace(f"answer: {problem.answer}", "answer: 1")
    assert consistency(problem, wrong).score == 0.5
    assert consistency(problem, wrong, combine="grounding").score == 1.0
    assert consistency(problem, wrong, combine="gate").score == 0.0


def test_a_fabricated_quote_or_line_grounds_nothing():
    problem = _problem(kind="retrieval", cite="quote")
    made_up = f'The code of {problem.id.split(":")[0]} is 12345.'  # codes have four digits: no such sentence
    assert made_up not in problem.meta["sentences"]
    quoted = consistency(problem, f'cite: "{made_up}"\nanswer: {problem.answer}')
    beyond = consistency(problem, f"cite: {len(problem.meta['sentences']) + 1}\nanswer: {problem.answer}")
    for fabricated in (quoted, beyond):
        assert fabricated.components["fabricated"] == 1.0 and fabricated.components["grounding"] == 0.0
        assert fabricated.score == 0.5
    half = consistency(problem, f'cite: "{made_up}"\n' + _cite(problem, problem.meta["evidence"]))
    assert half.components["fabricated"] == 0.5 and half.components["precision"] == 0.5


def test_a_quote_with_other_spacing_and_no_full_stop_still_names_its_sentence():
    problem = _problem(kind="retrieval")
    sentence = problem.meta["sentences"][problem.meta["evidence"][0]]
    loose = "cite:   " + "  ".join(sentence.rstrip(".").split()) + f"\nanswer: {problem.answer}"
    assert consistency(problem, loose).score == 1.0
    repeated = _cite(problem, problem.meta["evidence"] * 3)
    assert consistency(problem, repeated).diagnostics["cites"] == 1


def test_a_problem_without_a_document_is_refused_naming_the_task():
    problem = Problem(task="add", id="1+1", prompt="1+1\n", answer="2")
    with pytest.raises(ValueError, match="task 'add' does not provide; use it with the long_context task"):
        consistency(problem, "answer: 2")


def test_options_are_checked_when_the_reward_is_built():
    with pytest.raises(ValueError, match=r"reward 'consistency': options.combine='sum': expected"):
        build_reward("consistency", {"combine": "sum"})
    with pytest.raises(ValueError, match=r"reward 'consistency': options.weight=1.5: expected"):
        build_reward("consistency", {"weight": 1.5})
    reward = build_reward("consistency", {"combine": "gate"})
    problem = _problem()
    text = _cite(problem, problem.meta["evidence"])
    rollout = Rollout(problem, [], [0], [0.0], text, "stop", 0)
    assert reward.score_batch([problem], [rollout])[0].score == 1.0


def test_a_rewarder_pays_grounded_answers_more_and_logs_each_part():
    from tempering.rewards import Rewarder, TaskRewards
    from tempering.types import Group

    task = build_task("long_context", seed=0, kind="consistency", updates=2, near_misses=2, cite="quote",
                      length_tokens=1024)
    task.rewards = {"consistency": 1.0}
    rewarder = Rewarder([TaskRewards(task.name, task.rewards, task.metric, task.domain)],
                        options={"consistency": {"combine": "mix", "weight": 0.5}})
    problem = task.train_problem(0)
    texts = [_cite(problem, problem.meta["evidence"]), f"answer: {problem.answer}",
             _cite(problem, problem.meta["decoys"]), "answer: 1"]
    group = Group(problem, [Rollout(problem, [], [0], [0.0], t, "stop", 0) for t in texts])
    record = rewarder.score([group])
    assert [r.reward for r in group.rollouts] == [1.0, 0.5, 0.5, 0.0]
    assert [r.reward_components["cited_match"] for r in group.rollouts] == [1.0, 1.0, 1.0, 0.0]
    assert record["reward/consistency/exact"] == 0.25 and record["reward/consistency/decoys"] == 0.25


@pytest.mark.parametrize("value", ["number", "span"])
def test_a_task_asking_for_cites_is_graded_by_cited_match_and_evaluation_reports_cites_right(value):
    from tempering.eval.greedy import component_means

    task = build_task("long_context", seed=0, kind="retrieval", updates=1, near_misses=1, value=value, cite="quote",
                      length_tokens=1024)
    assert task.metric == "cited_match" and task.rewards == {"cited_match": 1.0}
    assert build_task("long_context", seed=0, kind="retrieval", value=value, length_tokens=1024).metric != "cited_match"
    reward = build_reward("cited_match")
    assert reward.summary == ("cites_right",)
    problem = task.train_problem(0)
    stale = problem.meta["decoys"][0]
    texts = [_cite(problem, problem.meta["evidence"]), _cite(problem, [stale]), f"answer: {problem.answer}",
             _cite(problem, problem.meta["evidence"]).replace(problem.answer, "wrong answer")]
    results = reward.score_batch([problem] * 4, [Rollout(problem, [], [0], [0.0], t, "stop", 0) for t in texts])
    assert [r.score for r in results] == [1.0, 1.0, 1.0, 0.0]
    assert [r.components["cites_right"] for r in results] == [1.0, 0.0, 0.0, 0.0]
    assert component_means(reward.summary, results) == {"cites_right": 0.25}
