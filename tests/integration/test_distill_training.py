"""On-policy distillation through real training steps: a miniature student learns from a
different miniature teacher, and its per-token reverse KL to the teacher on its own samples falls.

Both models are pre-trained by tempering.pretrain into the session's private cache: the
student is the tests' miniature built-in model, the teacher one of the same size trained on
a clean corpus (no classic mistakes), with another seed and more steps, named through
``algorithm.teacher.pretrain`` exactly as a user names a built-in teacher.
"""

import json
import statistics

from tempering.config import TrainConfig
from tempering.train import train

TEACHER = {"wrong_share": 0.0, "seed": 1, "steps": 200}
"""What the teacher's pre-training changes from the student's."""
RUN = {
    "steps": 16,
    "threads": 1,
    "tasks": [{"name": name, "options": {"digits": [2]}} for name in ("add", "sub")],
    "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 24},
    "learner": {"lr": 1e-3, "warmup_steps": 0},
    "eval": {"problems_per_task": 1, "max_new_tokens": 24},
    "checkpoint": {"every": 0},
}


def test_distillation_lowers_the_students_reverse_kl_to_a_different_teacher(tiny_model_dir, tmp_path):
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    teacher = {"path": "builtin:tiny", "pretrain": {**pretrain, **TEACHER}}
    config = TrainConfig.model_validate({**RUN, "pretrain": pretrain, "run_dir": str(tmp_path / "run"),
                                         "algorithm": {"advantage": "distill", "teacher": teacher}})

    train(config, progress=False)

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kl = [r["teacher_kl"] for r in records]
    first, last = statistics.fmean(kl[:3]), statistics.fmean(kl[-4:])
    assert first > 0.5, f"the teacher differs from the student: {kl}"
    assert last < 0.8 * first, f"reverse KL per token did not fall: {kl}"
