"""Where step records go: ``metrics.jsonl`` always, and the metric tools people already look at.

``metrics.jsonl`` (:class:`~tempering.reporting.metrics.MetricsWriter`) is the run's record; the
sinks named in ``logging.sinks`` get each step's numbers as well (every int or float value
of the record but ``step``; booleans, strings and lists are left to ``metrics.jsonl``):

- ``tensorboard``: event files in ``<run>/tensorboard`` (torch's ``SummaryWriter``);
- ``mlflow``: a run of experiment ``tempering`` in a local store, ``<run>/mlflow.db`` (SQLite);
- ``wandb``: an offline run in ``<run>/wandb``; nothing goes over the network
  (``wandb sync`` uploads it later, if wanted).

Each sink's package is optional; a configured sink whose package is missing is a
:class:`ConfigError` naming the extra to install, raised before the model is loaded
(:func:`check_sinks`).

Resume (``temper train --resume``) drops the records of steps after the checkpoint from
``metrics.jsonl``; the sinks then must not show those steps twice:

- TensorBoard purges them natively: the resumed writer starts with ``purge_step`` (the first
  step it will write), and readers drop every earlier-written event at or after that step;
- an MLflow metric history cannot be edited, so the earlier MLflow run is deleted (soft:
  ``mlflow gc`` removes it for good) and a new one replays the kept steps from
  ``metrics.jsonl`` before training goes on;
- W&B cannot rewind an offline run, so a new offline run replays the kept steps likewise; the
  earlier offline run's folder stays in ``<run>/wandb``, and the newest one is the whole run.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from tempering.config import ConfigError
from tempering.reporting.metrics import MetricsWriter, read_jsonl


class Sink(Protocol):
    """A destination for each step's numbers."""

    def write(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a step record that sinks get: int and float values, ``step`` aside.

    >>> scalars({"step": 3, "reward": 0.5, "policy_version": 2, "rollback": True, "note": "x"})
    {'reward': 0.5, 'policy_version': 2.0}
    """
    return {key: float(value) for key, value in record.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}


class TensorBoardSink:
    """Event files in ``<run>/tensorboard``, flushed every step so a killed run keeps its steps."""

    def __init__(self, run_dir: Path, history: list[dict], resumed: bool, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        first = history[-1]["step"] + 1 if history else 1
        self._writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=first if resumed else None)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MlflowSink:
    """A run of experiment ``tempering`` in the local store ``<run>/mlflow.db`` (SQLite: MLflow's
    file store cannot hold both ``reward`` and ``reward/format``, a file and a folder of one name)."""

    EXPERIMENT = "tempering"
    BATCH = 1000
    """Metrics per ``log_batch`` call: MLflow's limit."""

    def __init__(self, run_dir: Path, history: list[dict], resumed: bool, config: dict):
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # not the store's table creation
        self._client = MlflowClient(tracking_uri=mlflow_uri(run_dir))
        found = self._client.get_experiment_by_name(self.EXPERIMENT)
        experiment = found.experiment_id if found else self._client.create_experiment(
            self.EXPERIMENT, artifact_location=(run_dir / "mlflow-artifacts").resolve().as_uri())
        for earlier in self._client.search_runs([experiment]):  # a resumed run's, whose history it replaces
            self._client.delete_run(earlier.info.run_id)
        self._run = self._client.create_run(experiment, run_name=run_dir.name).info.run_id
        replay(self, history)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        for start in range(0, len(metrics), self.BATCH):
            self._client.log_batch(self._run, metrics=metrics[start : start + self.BATCH])

    def close(self) -> None:
        self._client.set_terminated(self._run)


class WandbSink:
    """An offline W&B run in ``<run>/wandb`` (``mode="offline"``: no network, ever)."""

    def __init__(self, run_dir: Path, history: list[dict], resumed: bool, config: dict):
        import wandb

        self._run = wandb.init(project="tempering", name=run_dir.name, dir=str(run_dir), mode="offline",
                               config=config, settings=wandb.Settings(silent=True, console="off"))
        replay(self, history)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


def mlflow_uri(run_dir: Path) -> str:
    """The tracking URI of a run's MLflow store, for ``MlflowClient`` and ``mlflow ui --backend-store-uri``."""
    return f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"


def replay(sink: Sink, history: list[dict]) -> None:
    """Send the kept records of a resumed run to a sink that starts empty."""
    for record in history:
        sink.write(record["step"], scalars(record))


@dataclass(frozen=True)
class SinkSpec:
    open: Callable[[Path, list[dict], bool, dict], Sink]
    """``(run folder, records kept in metrics.jsonl, resumed, resolved config) -> sink``."""
    modules: tuple[str, ...]
    """The modules it needs; one missing, the sink cannot be used."""
    extra: str
    """The ``tempering[...]`` extra that installs it."""


SINKS: dict[str, SinkSpec] = {
    "tensorboard": SinkSpec(TensorBoardSink, ("tensorboard",), "tensorboard"),
    "mlflow": SinkSpec(MlflowSink, ("mlflow", "sqlalchemy", "alembic"), "mlflow"),
    "wandb": SinkSpec(WandbSink, ("wandb",), "wandb"),
}


def check_sinks(names: list[str]) -> None:
    """A ConfigError naming the extra to install when a configured sink's package is missing."""
    for name in names:
        spec = SINKS[name]
        missing = [module for module in spec.modules if importlib.util.find_spec(module) is None]
        if missing:
            raise ConfigError(f"logging.sinks: {name} needs the {missing[0]} package, which is not installed: "
                              f"pip install 'tempering[{spec.extra}]' (or drop {name} from logging.sinks)")


class StepLog:
    """Each step's record to ``metrics.jsonl`` and to every configured sink."""

    def __init__(self, run_dir: Path, names: list[str], resumed: bool, config: dict):
        path = run_dir / "metrics.jsonl"
        history = read_jsonl(path) if path.exists() else []
        self._sinks: list[Sink] = []
        try:
            for name in names:
                self._sinks.append(SINKS[name].open(run_dir, history, resumed, config))
        except BaseException:
            self.close_sinks()
            raise
        self._file = MetricsWriter(path)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(record)  # first: metrics.jsonl is the record a resume trusts
        numbers = scalars(record)
        for sink in self._sinks:
            sink.write(record["step"], numbers)

    def close_sinks(self) -> None:
        for sink in self._sinks:
            sink.close()

    def close(self) -> None:
        self._file.close()
        self.close_sinks()
