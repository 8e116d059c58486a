"""The endpoints of ``temper serve`` that change or report what it serves: new weights from a
folder, a LoRA adapter loaded and unloaded, the policy (weight) version, and the vLLM
administration calls that RL clients make around a reload.

New weights also come over HTTP in chunks, assembled beside the served model and swapped in
whole at the commit (``/weights/begin``, ``/weights/chunk``, ``/weights/commit``: the protocol
is ``tempering.rollout.weight_transfer``'s), for a learner that shares no disk with the server.

What maps onto a reload from disk is done; vLLM's weight-transfer API (weights sent over
NCCL or IPC by a trainer: ``/init_weight_transfer_engine``, ``/update_weights`` and the rest of
``vllm/entrypoints/rl``) and its development-mode ``/collective_rpc`` are refused with a 501
that says to load a folder instead; so are pausing and aborting, which a server that samples
requests as they come has no use for.
"""

from __future__ import annotations

import json
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, Optional

from tempering.rollout.batcher import Batcher
from tempering.rollout.openai_api import RequestError
from tempering.rollout.weight_transfer import ADAPTER_FILES, Assembly, Transfer

RL_API = ("/init_weight_transfer_engine", "/shutdown_weight_transfer_engine", "/start_weight_update",
          "/start_draft_weight_update", "/update_weights", "/finish_weight_update", "/weight_checker",
          "/collective_rpc", "/pause", "/resume", "/abort_requests")
RL_API_GETS = ("/is_paused", "/get_world_size")
"""vLLM's RL and development endpoints that temper serve answers with a 501."""
RAW_POSTS = ("/weights/chunk",)
"""Endpoints whose body is raw bytes, given to them as ``data`` beside the query's fields."""


def not_supported(path: str) -> None:
    raise RequestError(f"{path} (vLLM's weight-transfer and engine-control API) is not supported by temper serve: "
                       "send new weights as a folder with POST /update_weights_from_disk {\"model_path\": DIR} "
                       "(rollout.server.reload: update_weights_from_disk), or a LoRA adapter with "
                       "POST /v1/load_lora_adapter, or either over HTTP in chunks with POST /weights/begin, "
                       "/weights/chunk and /weights/commit (rollout.server.weight_transfer: http)", 501)


class WeightEndpoints:
    """The weight and version endpoints of :class:`~tempering.rollout.server.Server` (mixed in):
    they use its ``batcher``, ``name``, ``adapter`` and ``replaced_adapters``."""

    batcher: Batcher
    name: str
    adapter: Optional[str]
    replaced_adapters: set[str]
    """Adapters loaded before the one served now (which took their place)."""
    assembly: Assembly
    """The weight transfer coming over HTTP, if one is open."""

    def weight_routes(self, method: str) -> dict[str, Callable]:
        if method == "GET":
            refused = {path: (lambda path=path: not_supported(path)) for path in RL_API_GETS}
            return {"/version": self.version, "/weight_info": self.weight_info, **refused}
        refused = {path: (lambda body, path=path: not_supported(path)) for path in RL_API}
        return {"/update_weights_from_disk": self.update_weights, "/v1/load_lora_adapter": self.load_lora_adapter,
                "/v1/unload_lora_adapter": self.unload_lora_adapter, "/reset_prefix_cache": self.reset_prefix_cache,
                "/update_weight_version": self.update_weight_version, "/weights/begin": lambda body: self.assembly.begin(body),
                "/weights/chunk": lambda body: self.assembly.chunk(body), "/weights/commit": self.commit_transfer,
                **refused}

    def version(self) -> dict:
        """vLLM's ``/version``, with this server's own version (it is not vLLM) and name."""
        return {"version": _package_version(), "server": "tempering"}

    def weight_info(self) -> dict:
        """vLLM's ``/weight_info``: the policy version, as the string vLLM's weight versions are."""
        return {"weight_version": str(self.batcher.version)}

    def update_weight_version(self, body: dict) -> dict:
        """vLLM's ``/update_weight_version``: ``{"new_version": "N"}`` sets the policy version to N
        (an integer here: the version every response carries)."""
        new = body.get("new_version")
        if not (isinstance(new, str) and new.isascii() and new.isdigit()):
            raise RequestError(f"'new_version' must be a whole number as a string (temper serve's policy versions "
                               f"are integers), got {new!r}", param="new_version")
        with self.batcher.lock:
            self.batcher.version = int(new)
        return {"success": True, "new_version": new}

    def reset_prefix_cache(self, body: Optional[dict] = None) -> dict:
        """vLLM's ``/reset_prefix_cache``: always a success, since no request's keys and values
        outlive its sampler call here (nothing is cached across requests)."""
        return {"success": True}

    def update_weights(self, body: dict) -> dict:
        folder = body.get("model_path")
        if not isinstance(folder, str) or not folder:
            raise RequestError("'model_path' must name a folder of safetensors weights", param="model_path")
        version = self.batcher.reload(folder, _version(body))
        return {"success": True, "message": f"loaded {folder}", "policy_version": version}

    def commit_transfer(self, body: dict) -> dict:
        """``/weights/commit``: the transfer whole and checked, its weights (or adapter) served
        from now on at its version; a 400 that leaves the served weights as they were otherwise."""
        transfer = self.assembly.commit(body)
        header = transfer.header
        if header["kind"] == "adapter":
            return self._commit_adapter(transfer)
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            weights = load(transfer.data)
        except SafetensorError as exc:
            raise RequestError(f"transfer {transfer.id}: not a safetensors payload ({exc})", param="transfer") from None
        version = self.batcher.swap(weights, header["version"], f"transfer {transfer.id}", "transfer")
        return {"success": True, "message": f"loaded {transfer.size} bytes sent over HTTP (sha256 "
                f"{header['sha256']})", "policy_version": version}

    def _commit_adapter(self, transfer: Transfer) -> dict:
        """An adapter transfer's two files written to a folder of this server's own, loaded (peft
        reads them at once), and the folder removed."""
        header = transfer.header
        with tempfile.TemporaryDirectory(prefix="tempering-adapter-") as folder:
            (Path(folder) / ADAPTER_FILES[0]).write_text(json.dumps(header["adapter_config"]))
            (Path(folder) / ADAPTER_FILES[1]).write_bytes(transfer.data)
            return self.load_lora_adapter({"lora_name": header["lora_name"], "lora_path": folder,
                                           "version": header["version"]})

    def load_lora_adapter(self, body: dict) -> dict:
        name, folder = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or name == self.name:
            raise RequestError(f"'lora_name' must name the adapter, other than the base model {self.name!r}",
                               param="lora_name")
        if not isinstance(folder, str) or not folder:
            raise RequestError("'lora_path' must name a folder holding a peft adapter", param="lora_path")
        version = self.batcher.load_adapter(name, folder, _version(body))
        if self.adapter not in (None, name):
            self.replaced_adapters.add(self.adapter)
        self.replaced_adapters.discard(name)
        self.adapter = name
        return {"success": True, "message": f"loaded the LoRA adapter {name!r} from {folder}", "policy_version": version}

    def unload_lora_adapter(self, body: dict) -> dict:
        """vLLM's ``/v1/unload_lora_adapter``: ``{"lora_name": NAME}`` stops serving the adapter
        (requests naming it are then a 404; the base model samples as before); the version stays.
        An adapter that a later one replaced is gone already: unloading it succeeds (vLLM's
        clients load the next adapter, then unload the one before)."""
        name = body.get("lora_name")
        if name in self.replaced_adapters:
            self.replaced_adapters.discard(name)
            return {"success": True, "message": f"the LoRA adapter {name!r} was replaced by {self.adapter!r}"}
        if not isinstance(name, str) or name != self.adapter:
            served = f"the adapter loaded is {self.adapter!r}" if self.adapter else "no adapter is loaded"
            raise RequestError(f"the LoRA adapter {name!r} cannot be found: {served}", 404, "lora_name")
        self.adapter = None
        return {"success": True, "message": f"unloaded the LoRA adapter {name!r}"}


def transfer_limit(model: Any) -> int:
    """The largest transfer a server of ``model`` takes: its state twice over in float32, plus 64 MiB."""
    return 8 * sum(t.numel() for t in model.state_dict().values()) + (64 << 20)


def _version(body: dict) -> Optional[int]:
    """The policy version a weight update asks for, if it names one."""
    version = body.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise RequestError(f"'version' must be an integer, got {version!r}", param="version")
    return version


def _package_version() -> str:
    """This package's version as installed (its metadata, not the package itself, which would
    import the API and the commands above this module)."""
    try:
        return version("tempering")
    except PackageNotFoundError:
        return "unknown"
