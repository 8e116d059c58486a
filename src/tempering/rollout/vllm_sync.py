"""New weights and LoRA adapters for running vLLM servers (``rollout.server.reload: vllm``), as 0.32 takes them.

Everything here goes through vLLM's development endpoints (the server started with
``VLLM_SERVER_DEV_MODE=1``, as ``tempering.rollout.vllm_launch`` starts it):

- weights: ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}``
  loads the safetensors in DIR in place (``update_config`` to a new folder fails on 0.32);
- after every change of weights or adapter, ``POST /reset_prefix_cache``: vLLM otherwise reuses
  KV blocks computed with the old weights for any prompt prefix it has seen (a block is 128
  tokens on CPU, so a shared system prompt or few-shot header is stale from the second step on);
- the server's weight version (``/update_weight_version``, ``/weight_info``) is set to 1, 2, ...
  after each change and read back; before a change it must still be the one last set, else
  another client is changing the server's weights and the run stops rather than train on them.
  (vLLM's completion replies do not carry it, so that is where it is checked.)
- a LoRA adapter is written to a fresh folder each time and loaded under a fresh name
  (``NAME-<version>``) that later requests name; the previous one is then unloaded, and only
  after that its folder removed: vLLM reads an adapter lazily, at the first request naming it,
  and a request for an adapter whose folder has gone kills the whole server. :meth:`VllmSync.close`
  unloads the last one, so the server outlives the run's clean-up.

Not done: vLLM's weight-transfer engines (``/init_weight_transfer_engine``, ``/update_weights``):
every backend of 0.32 needs CUDA, and the folder works on any machine.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Optional


class VllmSync:
    """Weight and adapter changes on the vLLM servers at ``urls`` (one model's, at one weight
    version), spoken to with ``request(method, path, body, plain=False, url=URL)`` (a
    ServerGenerator's); ``error`` is the exception class its failures raise. Every change goes
    to each server."""

    def __init__(self, request: Callable[..., dict], urls: list[str], error: type[Exception]):
        self.request, self.urls, self.error = request, urls, error
        found = [self.served(url) for url in urls]
        if len(set(found)) > 1:
            listing = ", ".join(f"{url} at {version}" for url, version in zip(urls, found))
            raise error(f"the servers are at different weight versions ({listing}); start them on the same weights")
        self.version = found[0]
        self.adapter: Optional[tuple[str, Path]] = None
        """The adapter loaded last: its name and folder."""

    def served(self, url: str) -> Optional[int]:
        """``url``'s weight version: an integer this class set, or None (vLLM's "default")."""
        found = self.request("GET", "/weight_info", None, url=url).get("weight_version")
        return int(found) if isinstance(found, str) and found.isdigit() else None

    def _check_unchanged(self) -> None:
        for url in self.urls:
            served = self.served(url)
            if served != self.version:
                raise self.error(f"{url} is at weight version {served}, not {self.version} as this run left it: "
                                 "another client is changing its weights")

    def load_weights(self, folder: Path) -> int:
        """Have each server load the safetensors in ``folder``; the new weight version."""
        self._check_unchanged()
        for url in self.urls:
            self.request("POST", "/collective_rpc", {"method": "reload_weights",
                                                     "kwargs": {"weights_path": str(folder)}}, url=url)
        return self._changed()

    def load_adapter(self, write: Callable[[Path], None], root: Path, name: str) -> str:
        """Write an adapter with ``write(folder)`` into a fresh folder under ``root`` and load it
        on each server; the name requests must now give as their ``model``."""
        self._check_unchanged()
        version = (self.version or 0) + 1
        adapter = (f"{name}-{version}", root / f"adapter-{version}")
        write(adapter[1])
        for url in self.urls:
            self.request("POST", "/v1/load_lora_adapter", {"lora_name": adapter[0], "lora_path": str(adapter[1])},
                         plain=True, url=url)
        previous, self.adapter = self.adapter, adapter
        if previous is not None:
            self._unload(previous)
        self._changed()
        return adapter[0]

    def _unload(self, adapter: tuple[str, Path]) -> None:
        """Unload an adapter from every server, then remove its folder (never the other way round)."""
        for url in self.urls:
            self.request("POST", "/v1/unload_lora_adapter", {"lora_name": adapter[0]}, plain=True, url=url)
        shutil.rmtree(adapter[1], ignore_errors=True)

    def _changed(self) -> int:
        """After new weights or a new adapter: no stale prefix blocks, and the next weight version."""
        expected = (self.version or 0) + 1
        for url in self.urls:
            if not self.request("POST", "/reset_prefix_cache", None, url=url).get("success"):
                raise self.error(f"{url} could not reset its prefix cache (requests were running on it: "
                                 "another client is using the server)")
            self.request("POST", "/update_weight_version", {"new_version": str(expected)}, url=url)
            served = self.served(url)
            if served != expected:
                raise self.error(f"{url} is at weight version {served} after new weights, not {expected}: "
                                 "another client is changing its weights")
        self.version = expected
        return expected

    def close(self) -> None:
        """Unload the last adapter (its folder is then free to go)."""
        if self.adapter is not None:
            adapter, self.adapter = self.adapter, None
            self._unload(adapter)
