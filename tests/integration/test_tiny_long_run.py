"""builtin:tiny-long's recipe in miniature, end to end: a pre-training whose corpus is a length
curriculum in token-budget steps, a model that takes prompts past its longest trained length,
and the long config's layout (curriculum tasks read at every length, an evaluation-only task at
twice the longest) run on it. The measured RL gain of the full model is in docs/models.md."""

import json

from tempering import tiny_long
from tempering.config import TrainConfig, load_config
from tempering.pretrain import ensure_pretrained
from tempering.train import train

LENGTHS = [256, 384]


def test_a_miniature_tiny_long_pre_trains_by_length_and_is_read_at_twice_its_longest_length(tempering_cache, tmp_path):
    corpus = [spec.model_copy(update={"options": {**spec.options, "lengths": LENGTHS, "corpus_docs": [24, 6]}})
              for spec in tiny_long.corpus_tasks()]
    recipe = tiny_long.recipe().model_copy(update={
        "tasks": corpus, "hidden_size": 32, "layers": 1, "heads": 2,
        "steps": 9, "warmup_steps": 2, "nope_layers": [0], "nope_from_step": 5})
    model_dir = ensure_pretrained(recipe, progress=False)
    record = json.loads((model_dir / "pretrain.json").read_text())["stats"]
    # 24 documents of up to 256 + 16 tokens four to a step, then 6 of up to 400 two to a step: the 9 steps
    assert 24 * 200 + 6 * 300 < record["tokens"] <= 24 * 272 + 6 * 400
    # and the recipe's copy rows beside them, each a string of 4 to 16 twice around 2 to 30 filler words
    assert 9 * recipe.copy_rows * 21 <= record["copy_tokens"] <= 9 * recipe.copy_rows * 280 and recipe.copy_rows
    assert json.loads((model_dir / "tokenizer_config.json").read_text())["model_max_length"] == recipe.max_positions
    # its layer read without positions from step 5 on, as the saved config says
    assert json.loads((model_dir / "config.json").read_text())["no_rope_layers"] == [0]

    shipped = load_config("long")
    tasks = [spec.model_copy(update={"options": {**spec.options, **(
        {"lengths": LENGTHS} if "lengths" in spec.options else {"length_tokens": 2 * LENGTHS[-1]})}})
        for spec in shipped.tasks]
    tasks[-1] = tasks[-1].model_copy(update={"name": f"long_context:retrieval-{2 * LENGTHS[-1]}"})
    summary = train(TrainConfig.model_validate({
        **shipped.model_dump(exclude={"tasks", "model", "pretrain"}), "steps": 2, "model": {"path": str(model_dir)},
        "tasks": [t.model_dump() for t in tasks], "run_dir": str(tmp_path / "run"),
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6},
        "eval": {"problems_per_task": 2, "problems_per_length": 2, "max_new_tokens": 6}}), progress=False)
    for when in ("eval_before", "eval_after"):
        assert {task: list(curve) for task, curve in summary[when]["by_length"].items()} == {
            t.name: [str(n) for n in LENGTHS] for t in tasks[:-1]}
        assert tasks[-1].name in summary[when]["per_task"]
