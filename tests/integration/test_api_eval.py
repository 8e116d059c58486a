"""``tempering.evaluate`` is ``temper eval`` from Python: best-of-k by the task's verifier and
by a reward model, and metrics by round for a task played in an environment, with the very
numbers the command prints for the same settings.

Real components: the miniature model as the policy, a reward model trained from it by
``temper rm train``'s code (a saved head, so its scores are the same in every load), the
sampler, the graders and the episode runner.
"""

import json

import pytest

import tempering
from tempering.cli import main
from tempering.envs import ENVS
from tempering.rm import RMSettings, arithmetic_pairs, read_pairs, train_reward_model


class OneLineATurn:
    """Each model turn is one line; the episode ends with the line that gives an answer, so
    a problem answered on the third line was answered in round three."""

    stop = ("\n",)

    def reset(self, problem):
        return problem.prompt

    def step(self, completion):
        return tempering.Step(done="answer:" in completion)


@pytest.fixture(scope="module")
def one_line_env():
    tempering.register_env("api_one_line")(OneLineATurn)
    yield "api_one_line"
    ENVS.pop("api_one_line")


@pytest.fixture(scope="module")
def reward_model(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rm")
    (folder / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in arithmetic_pairs(32)))
    settings = RMSettings(base=str(tiny_model_dir), batch_size=8, max_steps=2)
    train_reward_model(read_pairs(folder / "pairs.jsonl"), folder / "model", settings)
    return folder / "model"


@pytest.fixture(scope="module")
def elevens(tmp_path_factory) -> str:
    """Sums that make 11 (``3+8``), the answer the miniature model writes most often, so its
    samples are right often enough, and wrong often enough, for the metrics to differ."""
    path = tmp_path_factory.mktemp("data") / "elevens.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+{11 - a}", "answer": "11"}) + "\n" for a in range(2, 10)) * 4)
    return str(path)


def test_evaluate_gives_best_of_k_by_reward_model_and_by_round_as_temper_eval_does(
        tiny_model_dir, reward_model, one_line_env, elevens, capsys):
    task = {"name": "dataset", "options": {"path": elevens, "kind": "text", "style": "raw", "eval_fraction": 0.5},
            "env": {"name": one_line_env, "max_turns": 5}}
    overrides = ["tasks=" + json.dumps([task]), "eval.problems_per_task=6", "eval.max_new_tokens=16",
                 "rollout.temperature=0.3"]

    result = tempering.evaluate(str(tiny_model_dir), "quickstart", overrides, samples=3, k=[1, 3],
                                best_of=["verifier", f"rm:{reward_model}"])

    metrics = result["metrics"]["dataset"]
    assert {"best_of@1[rm]", "best_of@3[rm]", "best_of@1[verifier]", "best_of@3[verifier]", "greedy[round<=1]",
            "greedy[round<=5]", "pass@1[round<=1]", "pass@3[round<=4]", "pass@3[round<=5]"} <= set(metrics)
    value = {name: entry["value"] for name, entry in metrics.items()}
    assert 0 < value["pass@3"], "some samples are right, so the identities below are not 0 = 0"
    assert value["best_of@1[rm]"] == pytest.approx(value["pass@1"], abs=1e-9), "best of one sample is the sample"
    assert value["best_of@3[verifier]"] == pytest.approx(value["pass@3"], abs=1e-9), "the oracle is pass@k"
    assert value["best_of@3[rm]"] <= value["pass@3"] + 1e-9
    by_round = [value[f"pass@1[round<={r}]"] for r in range(1, 6)]
    assert by_round == sorted(by_round) and by_round[-1] == value["pass@1"] and by_round[0] < value["pass@1"]
    assert value["greedy[round<=5]"] == value["greedy"]
    assert result["settings"]["max_turns"] == {"dataset": 5}

    with pytest.raises(SystemExit) as done:
        main(["eval", str(tiny_model_dir), *overrides, "--n", "3", "--k", "1,3", "--best-of", "verifier",
              "--best-of", f"rm:{reward_model}", "--json", "-", "--quiet"])
    assert done.value.code == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(result)), "the command's numbers"


@pytest.mark.parametrize("arguments, message", [
    ({"best_of": ["verifier"]}, "k and best_of need samples"),
    ({"samples": 2, "best_of": ["judge"]}, "best_of 'judge': expected verifier or rm:PATH"),
    ({"samples": 2, "best_of": ["rm:a", "rm:b"]}, "best_of: more than one reward model given (a, b)"),
])
def test_evaluate_refuses_best_of_it_cannot_do_before_loading_a_model(tmp_path, monkeypatch, arguments, message):
    monkeypatch.setenv("TEMPERING_CACHE", str(tmp_path))
    with pytest.raises(tempering.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tempering.evaluate("builtin:tiny", tasks=["add"], **arguments)
    assert not any(tmp_path.iterdir()), "nothing was pre-trained"
