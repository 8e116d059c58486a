"""A learner stepping through saved batches, run by ``test_data_parallel.py``: alone with
``python``, or as one of several processes under ``torchrun``. Writes the final weights
(gathered whole under FSDP) from rank 0. Rank 0 steps through the batches and its learner
hands each to the other ranks, which follow it (``tempering.learner.parallel.follow``) as under
``temper train``.

Usage: ``data_parallel_worker.py CONFIG.json BATCHES.pt OUT.pt``
"""

import sys
from pathlib import Path

import torch

from tempering.build import build_learner, resolve_algorithm
from tempering.config import TrainConfig
from tempering.learner.parallel import follow, from_env, full_state
from tempering.policy import load_model, with_lora


def main(config_path: str, batches_path: str, out_path: str) -> None:
    torch.set_num_threads(1)
    config = TrainConfig.model_validate_json(Path(config_path).read_text())
    torch.manual_seed(config.seed)
    parallel = from_env(config.learner.parallel, torch.device("cpu"))
    model, _, _ = load_model(config, config.model.path, progress=False)
    learner = build_learner(with_lora(config, model), config, resolve_algorithm(config), parallel=parallel)
    start = full_state(learner.model)
    if parallel is None or parallel.leads:  # the leader's steps hand each batch to the others
        records = [learner.step(batch) for batch in torch.load(batches_path, weights_only=False)]
        if parallel is not None:
            parallel.tell("stop")
    else:
        follow(learner)
    weights = full_state(learner.model)
    if parallel is None or parallel.leads:
        torch.save({"start": start, "weights": weights, "records": records}, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
