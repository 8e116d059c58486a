"""Helpers for the tests that take a grader away under a real run: ``temper sandbox serve`` on
127.0.0.1 started and stopped, ``temper`` commands in the background with their stderr, and a
run's step records. Not a test module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TIMEOUT_S = 300


def serve_sandbox(port: int) -> subprocess.Popen:
    """``temper sandbox serve`` on 127.0.0.1:port, returned once it answers. Started through the
    sandbox's own command module (what ``temper sandbox`` runs), which spares the seconds of
    importing the training stack."""
    process = subprocess.Popen([sys.executable, "-m", "tempering.sandbox.cli", "sandbox", "serve", "--host",
                                "127.0.0.1", "--port", str(port), "--workers", "2"], stderr=subprocess.PIPE, text=True)
    line = process.stderr.readline()
    if "serving on" not in line:
        process.kill()
        raise AssertionError(f"the sandbox service did not start: {line}{process.stderr.read()}")
    threading.Thread(target=process.stderr.read, daemon=True).start()
    return process


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)


class Temper:
    """A ``temper`` command running in the background, its stderr collected line by line;
    ``env`` adds variables (``TEMPERING_STOP_AT``, ``TEMPERING_KILL_AT``)."""

    def __init__(self, *args: str, env: dict | None = None):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
        self.process = subprocess.Popen([sys.executable, "-m", "tempering.cli", *args], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for(self, condition, what: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not condition():
            if self.process.poll() is not None:
                self._reader.join(timeout=10)
                raise AssertionError(f"temper exited ({self.process.returncode}) before {what}:\n{self.stderr[-3000:]}")
            if time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError(f"timed out waiting for {what}:\n{self.stderr[-3000:]}")
            time.sleep(0.05)

    def halted(self) -> bool:
        """Whether the process stopped itself (SIGSTOP at a ``TEMPERING_STOP_AT`` point)."""
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] == "T"

    def wait_halted(self, what: str) -> None:
        self.wait_for(self.halted, what)

    def go_on(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def finish(self) -> int:
        code = self.process.wait(timeout=TIMEOUT_S)
        self._reader.join(timeout=10)
        return code


def records(run: Path) -> list[dict]:
    """The run's step records so far (none before its first step)."""
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
