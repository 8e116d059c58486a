"""How long one weight sync to ``temper serve`` takes: written to disk for the server to read
(``rollout.server.weight_transfer: disk``) against sent over HTTP in chunks (``http``).

    python bench/weight_sync.py [--model builtin:tiny] [--syncs 7] [--chunk-mib 8] [key=value ...]

A ``temper serve`` of ``--model`` is started as a process of its own on 127.0.0.1 (one torch
thread), and the learner's side is a :class:`~tempering.rollout.remote.ServerGenerator` in this
process, one per way. ``key=value`` overrides go to the config the model is made with (e.g.
``pretrain.steps=1`` for the built-in tiny model's shapes without its minutes of pre-training:
a sync moves bytes, and its time does not depend on what they hold). Each sync is ``load_weights`` as a training step calls it, new weights
every time (the model with a little noise), the two ways taking turns so that both see the
same machine; a first sync of each way, which also writes the model's config and tokenizer
for the disk way, is not counted. Loopback HTTP and a local disk: the numbers measure the
serialization, copies and checks of each way, not a network or a shared file system.

Prints JSON::

    {"model", "overrides", "parameters", "payload_mib", "chunk_mib", "syncs", "cpu",
     "disk_s": {"median", "min", "max"}, "http_s": {...}, "http_over_disk": median ratio,
     "http_mib_per_s": payload over the median http sync}
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time

import torch

from tempering.config import load_config
from tempering.policy import load_model
from tempering.rollout.remote import ServerGenerator, ServerSettings

from report import cpu_model
from scale_servers import served


def noisy(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """New weights as a step publishes them: each tensor its own copy, a little moved."""
    noise = torch.Generator().manual_seed(seed)
    return {k: v + 1e-3 * torch.randn(v.shape, generator=noise) if v.is_floating_point() else v.clone()
            for k, v in weights.items()}


def summary(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def main(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    config = load_config(None, [f"model.path={args.model}", "threads=1", *args.overrides])
    model, tokenizer, resolved = load_model(config, args.model, progress=False)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with served(str(resolved), threads=1) as url:  # a resolved folder: the server needs no config
        with tempfile.TemporaryDirectory() as folder:
            chunk_bytes = int(args.chunk_mib * (1 << 20))
            ways = {"disk": ServerGenerator(ServerSettings(url, weights_dir=folder), tokenizer, model.config),
                    "http": ServerGenerator(ServerSettings(url, weight_transfer="http", chunk_bytes=chunk_bytes),
                                            tokenizer, copy.deepcopy(model.config))}
            times: dict[str, list[float]] = {name: [] for name in ways}
            for sync in range(args.syncs + 1):
                for name, generator in ways.items():
                    new = noisy(weights, sync)
                    started = time.perf_counter()
                    generator.load_weights(new)
                    if sync:  # the first of each way is a warm-up
                        times[name].append(time.perf_counter() - started)
    from safetensors.torch import save

    payload_mib = len(save(weights)) / (1 << 20)
    disk, http = summary(times["disk"]), summary(times["http"])
    return {"model": args.model, "overrides": args.overrides, "parameters": sum(p.numel() for p in model.parameters()),
            "payload_mib": round(payload_mib, 3), "chunk_mib": args.chunk_mib, "syncs": args.syncs,
            "cpu": cpu_model(), "disk_s": disk, "http_s": http, "http_over_disk": http["median"] / disk["median"],
            "http_mib_per_s": payload_mib / http["median"]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny", help="model path or builtin:NAME (builtin:smollm2)")
    parser.add_argument("--syncs", type=int, default=7, help="timed syncs of each way (the median is reported)")
    parser.add_argument("--chunk-mib", type=float, default=8.0, help="size of one HTTP chunk, MiB")
    parser.add_argument("overrides", nargs="*", help="config overrides for making the model (key=value)")
    print(json.dumps(main(parser.parse_args()), indent=2))
