"""Data-parallel learners: several processes take one optimizer step together, on one batch.

Every learner process holds the whole batch (the leader, rank 0, samples, scores and computes
advantages, then hands it to the others, see :class:`DataParallel.tell`); each computes the
loss of its share of the rows (:meth:`DataParallel.rows`) normalised by the *whole* batch's
token and row counts, so the per-rank losses add up to the one-process loss of the batch and
their gradients are **summed**, never averaged. The optimizer then takes the same step
everywhere. Sampling stays on the leader: its batch is what a one-process run would train
on, so a run is the same run whatever the number of learners, up to floating-point
summation order.

Two layouts (``learner.parallel``):

- ``ddp``: every process holds the whole model; after a step's backward passes the gradients
  are all-reduced (summed) in one flat buffer. Not torch's ``DistributedDataParallel``
  wrapper: its per-backward bucketed all-reduce averages, and wants every process to run
  the same number of backward passes, while the plan (``tempering.learner.plan``) gives each share
  its own micro-batches.
- ``fsdp``: the decoder layers and the rest of the model are sharded with FSDP2
  (``fully_shard``); each forward all-gathers a layer's parameters and each backward
  reduce-scatters (sums) its gradients, so every process must run the same number of passes:
  a process with fewer micro-batches runs idle ones (:func:`idle_pass`) that add zero.

Processes find each other through ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``): gloo on CPU, NCCL on CUDA.

Under ``fsdp`` the leader also keeps a plain, unsharded copy of the policy (``whole``) that
``temper train`` samples, evaluates and saves with: every step ends with the ranks gathering
the shards into it (:func:`gather_into`), and checkpoints hold the optimizer state gathered
whole (:func:`optimizer_state`), so a run resumes on any number of ranks' shards of it. That
copy costs the leader one more model's memory.

Not done here: sharding the frozen models (a KL reference copy, a critic); under ``fsdp``
those are refused by ``tempering.build``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist

from tempering.types import Batch

PARALLEL = ("ddp", "fsdp")


@dataclass
class DataParallel:
    """This process's place among the learners."""

    rank: int
    world: int
    kind: str
    """"ddp" or "fsdp"."""

    @property
    def leads(self) -> bool:
        """Rank 0 samples, writes checkpoints and metrics, and tells the others what to do."""
        return self.rank == 0

    def rows(self, batch: Batch) -> Batch:
        """This rank's contiguous share of the batch's rows (the first ranks get one more
        when the rows do not divide evenly; a rank may get none)."""
        share = torch.tensor_split(torch.arange(len(batch)), self.world)[self.rank]
        return batch.select(share.to(batch.input_ids_BT.device))

    def total(self, value: float) -> float:
        """The sum of ``value`` over the ranks."""
        tensor = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(tensor)
        return float(tensor.item())

    def most(self, value: int) -> int:
        """The largest ``value`` over the ranks."""
        tensor = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """Each key summed over the ranks (a key a rank lacks counts 0 there); the ranks'
        values must already be shares of the whole batch."""
        keys: list[Any] = [None] * self.world
        dist.all_gather_object(keys, sorted(totals))
        names = sorted(set().union(*keys))
        values = torch.tensor([totals.get(name, 0.0) for name in names], dtype=torch.float64)
        dist.all_reduce(values)
        return dict(zip(names, values.tolist()))

    def sum_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """``ddp``: every parameter's gradient summed over the ranks, in one flat all-reduce
        (a rank that computed none contributes zeros). ``fsdp`` summed them in the backward."""
        if self.kind != "ddp":
            return
        parameters = list(parameters)
        for p in parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in parameters])
        dist.all_reduce(flat)
        offset = 0
        for p in parameters:
            p.grad.copy_(flat[offset: offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def tell(self, command: str, *args: Any) -> None:
        """Leader: send a command (a learner method's name and arguments) to the other ranks."""
        dist.broadcast_object_list([(command, args)], src=0)

    def listen(self) -> tuple[str, tuple]:
        """Follower: wait for the leader's next command."""
        message: list[Any] = [None]
        dist.broadcast_object_list(message, src=0)
        return message[0]

    def share_weights(self, model: Any, whole: Any = None) -> None:
        """Every rank takes rank 0's weights (after it loaded a checkpoint's): ``ddp`` from
        rank 0's model, ``fsdp`` from rank 0's ``whole`` copy, each rank keeping its shard."""
        if self.kind == "ddp":
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)
            return
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        weights = whole.state_dict() if self.leads else {}
        set_model_state_dict(model, weights, options=_full(broadcast_from_rank0=True))

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        """Leave the process group. A process that exits with gloo's threads still running may
        die of ``terminate called without an active exception`` after its work is done."""
        if dist.is_initialized():
            dist.destroy_process_group()


def follow(learner: Any) -> None:
    """A follower's whole run: call the learner methods the leader names (``step``,
    ``state_dict``, ``load_state_dict``), until it says ``stop``."""
    while (message := learner.parallel.listen())[0] != "stop":
        getattr(learner, message[0])(*message[1])


def from_env(kind: str, device: torch.device) -> Optional[DataParallel]:
    """This process's :class:`DataParallel` when started by ``torchrun`` with more than one
    process (joining the process group: gloo on CPU, NCCL on CUDA), else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        return None
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DataParallel(dist.get_rank(), world, kind)


def local_device(device: torch.device) -> torch.device:
    """Under ``torchrun`` on CUDA, this process's own GPU (``LOCAL_RANK``); else ``device``."""
    if device.type != "cuda" or "LOCAL_RANK" not in os.environ:
        return device
    index = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def distribute(model: Any, parallel: DataParallel) -> Any:
    """The model laid out for ``parallel``: ``ddp`` gives every rank rank 0's weights; ``fsdp``
    shards each decoder layer, then the rest, with gradients summed rather than averaged."""
    if parallel.kind == "ddp":
        parallel.share_weights(model)
        return model
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in model.get_decoder().layers:
        fully_shard(layer)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    return model


def idle_pass(model: Any, device: torch.device, grad: bool) -> None:
    """``fsdp``: a forward (and backward, with ``grad``) on one token that adds nothing, so this
    rank joins the collectives of a pass the others run on real rows."""
    with torch.set_grad_enabled(grad):
        logits = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False).logits
    if grad:
        (logits.sum() * 0.0).backward()


def full_state(model: Any) -> dict[str, torch.Tensor]:
    """A copy of the model's whole weights on every rank (``fsdp`` gathers the shards: every
    rank must call it)."""
    return {name: tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor.detach().clone()
            for name, tensor in model.state_dict().items()}


def _full(**options: bool) -> Any:
    """``StateDictOptions`` for whole (unsharded) state dicts."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **options)


def gather_into(model: Any, whole: Any) -> None:
    """``fsdp``: the sharded ``model``'s whole weights loaded into rank 0's ``whole`` copy
    (every rank must call it; the others pass None and keep nothing)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    weights = get_model_state_dict(model, options=_full(cpu_offload=True))
    if whole is not None:
        whole.load_state_dict(weights)


def optimizer_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``fsdp``: the optimizer's state gathered whole on rank 0, keyed by parameter name
    (every rank must call it; the others get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full(cpu_offload=True))


def load_optimizer_state(model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``fsdp``: a whole state of :func:`optimizer_state`, every rank keeping its shard of it."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=_full())
