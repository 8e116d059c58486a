"""Train and evaluate from Python, cell by cell (``# %%`` cells run one at a time in Jupyter,
VS Code or PyCharm; the file also runs whole as a script).

    python examples/train_and_evaluate.py [key=value ...]

Overrides on the command line apply to the config below, as with ``temper train``.
"""

# %% The config: a dict of the same keys a YAML file holds (see the configuration reference).
import sys

from tempering import evaluate, load_config, load_model, train

config = load_config({
    "steps": 30,
    "tasks": [{"name": "add", "options": {"digits": [2]}}, {"name": "mul", "options": {"digits": [1, 2]}}],
    "rollout": {"prompts_per_step": 8, "group_size": 8},
    "eval": {"problems_per_task": 32},
}, sys.argv[1:])
print(config.algorithm)

# %% Train: the run folder gets metrics.jsonl, samples.jsonl, checkpoints and summary.json.
summary = train(config, progress=True)
print("run folder:", summary["checkpoint"].rsplit("/", 1)[0])

# %% Evaluate the trained model again, on a task it was not trained on as well.
result = evaluate(summary["checkpoint"], config, tasks=["add", "mul", "sub"])
for task, accuracy in result["per_task"].items():
    print(f"{task}: {accuracy}")

# %% Load the checkpoint as a plain transformers model and complete a prompt greedily.
model, tokenizer = load_model(summary["checkpoint"])
ids = tokenizer("47+38\n", return_tensors="pt")["input_ids"]
output = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
print(tokenizer.decode(output[0, ids.shape[1]:], skip_special_tokens=True))
