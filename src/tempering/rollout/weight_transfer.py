"""New weights sent to a server over HTTP in chunks (``rollout.server.weight_transfer: http``),
for servers that share no disk with the learner.

The protocol, between :func:`send` (the learner's side) and :class:`Assembly` (the server's):

1. ``POST /weights/begin {"kind", "bytes", "sha256", "version", ...}``: a transfer of ``bytes``
   bytes whose SHA-256 is ``sha256``, to be served as policy ``version``. ``kind`` is
   ``weights`` (a safetensors file of the whole state) or ``adapter`` (peft's
   ``adapter_model.safetensors``, with ``adapter_config`` and ``lora_name`` in the body). The
   server answers ``{"transfer": ID}``. One transfer is open at a time: a new one drops the
   one before (the learner is the only writer; a learner that restarts begins again).
2. ``POST /weights/chunk?transfer=ID&offset=N`` with the raw bytes as the body
   (``application/octet-stream``): kept beside the served model, which is not touched. A
   chunk sent again (a retry) replaces its first copy; one that overlaps another is refused.
3. ``POST /weights/commit {"transfer": ID}``: every byte must have come and their SHA-256 must
   be the one announced; then the tensors are read from the joined bytes, checked against the model
   and copied in while no sampler call runs (``Batcher.swap``), and the policy version becomes
   ``version``. Any failure is a 400 naming what was wrong (bytes missing, a checksum that
   differs, weights of another model); the transfer is dropped and the old weights go on
   serving at the old version.

The policy version a server reports changes at the commit alone, so a completion reply states
the version whose weights sampled it, whole. What stays on the learner between steps
(:class:`Payload`) is the last payload, replayed onto a server that comes back after failover.

Not done: several transfers at once, resuming a transfer from where a dropped connection left
it (the whole transfer is sent again), compression, and sending only the tensors that changed;
vLLM servers keep the folder path (``vllm_sync``: its 0.32 weight-transfer engines need CUDA).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from tempering.rollout.openai_api import RequestError

KINDS = ("weights", "adapter")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""The two files of a peft adapter: the first travels in the begin request, the second as the payload."""


@dataclass(frozen=True)
class Payload:
    """What one transfer carries: the bytes, their SHA-256, and for an adapter its config and name."""

    kind: str
    data: bytes
    sha256: str
    adapter_config: Optional[dict] = None
    lora_name: Optional[str] = None

    def header(self, version: int) -> dict:
        """The begin request's body."""
        extra = {} if self.kind == "weights" else {"adapter_config": self.adapter_config, "lora_name": self.lora_name}
        return {"kind": self.kind, "bytes": len(self.data), "sha256": self.sha256, "version": version, **extra}


def weights_payload(weights: dict[str, torch.Tensor]) -> Payload:
    """The learner's whole state as one safetensors file in memory."""
    from safetensors.torch import save

    data = save({k: v.detach().contiguous().cpu() for k, v in weights.items()})
    return Payload("weights", data, hashlib.sha256(data).hexdigest())


def adapter_payload(folder: Path, name: str) -> Payload:
    """The peft adapter saved in ``folder``, to be served as ``name``."""
    config, data = (folder / ADAPTER_FILES[0]).read_text(), (folder / ADAPTER_FILES[1]).read_bytes()
    return Payload("adapter", data, hashlib.sha256(data).hexdigest(), json.loads(config), name)


def send(request: Callable[..., dict], url: str, payload: Payload, version: int, chunk_bytes: int,
         failover: bool) -> dict:
    """Send ``payload`` to ``url`` as policy ``version`` in chunks of ``chunk_bytes`` and commit
    it; the commit's reply. ``request(method, path, body, url=, failover=)`` is the caller's
    (a ServerGenerator's), a bytes body sent as it is."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    transfer = request("POST", "/weights/begin", payload.header(version), url=url, failover=failover)["transfer"]
    view = memoryview(payload.data)
    for offset in range(0, len(view), chunk_bytes):
        request("POST", f"/weights/chunk?transfer={transfer}&offset={offset}", bytes(view[offset:offset + chunk_bytes]),
                url=url, failover=failover)
    return request("POST", "/weights/commit", {"transfer": transfer}, url=url, failover=failover)


@dataclass
class Transfer:
    """One transfer being assembled on the server: its chunks as they came, joined at the commit
    (no buffer of the whole size is made up front: on some kernels first touching fresh memory
    costs as much as receiving it)."""

    id: str
    header: dict
    size: int
    chunks: dict[int, bytes] = field(default_factory=dict)
    """Offset -> the bytes that came for it."""
    data: bytes = b""
    """The whole payload, once committed."""

    def put(self, start: int, data: bytes) -> None:
        """Keep ``data`` at ``start``: a chunk sent again replaces its first copy; one that
        overlaps another chunk, or runs past the end, is refused."""
        end = start + len(data)
        clash = next((o for o, d in self.chunks.items() if o != start and o < end and start < o + len(d)), None)
        if not data or end > self.size or clash is not None:
            raise RequestError(f"a chunk of {len(data)} bytes at offset {start} does not fit in the transfer's "
                               f"{self.size} bytes" + ("" if clash is None else f" (it overlaps the chunk at {clash})"),
                               param="offset")
        self.chunks[start] = data

    def missing(self) -> list[tuple[int, int]]:
        """The byte ranges ``[start, end)`` no chunk has covered yet."""
        gaps, reached = [], 0
        for offset, data in sorted(self.chunks.items()):
            if offset > reached:
                gaps.append((reached, offset))
            reached = max(reached, offset + len(data))
        if reached < self.size:
            gaps.append((reached, self.size))
        return gaps


class Assembly:
    """The server's side of the protocol (see the module docstring) without HTTP or the model:
    it collects a transfer's bytes and gives them back, checked, at the commit. ``limit_bytes``
    bounds the size a transfer may announce (no chunk goes past it)."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.open: Optional[Transfer] = None
        self.lock = threading.Lock()  # requests come on threads of their own

    def begin(self, body: dict) -> dict:
        with self.lock:
            return self._begin(body)

    def chunk(self, body: dict) -> dict:
        with self.lock:
            return self._chunk(body)

    def commit(self, body: dict) -> Transfer:
        """The transfer named in ``body``, whole and with the checksum announced; a RequestError
        otherwise. Either way the transfer is closed."""
        with self.lock:
            return self._commit(body)

    def _begin(self, body: dict) -> dict:
        kind, size, digest, version = body.get("kind"), body.get("bytes"), body.get("sha256"), body.get("version")
        if kind not in KINDS:
            raise RequestError(f"'kind' must be one of {', '.join(KINDS)}, got {kind!r}", param="kind")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= self.limit_bytes:
            raise RequestError(f"'bytes' must be a whole number from 1 to {self.limit_bytes} (this server's limit "
                               f"for a transfer), got {size!r}", 413 if isinstance(size, int) else 400, "bytes")
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise RequestError("'sha256' must be the payload's SHA-256 as 64 lowercase hex digits", param="sha256")
        if isinstance(version, bool) or not isinstance(version, int):
            raise RequestError(f"'version' must be the policy version the weights are, an integer; got {version!r}",
                               param="version")
        if kind == "adapter" and not (isinstance(body.get("adapter_config"), dict) and body.get("lora_name")):
            raise RequestError("an adapter transfer needs 'adapter_config' (peft's adapter_config.json) and "
                               "'lora_name'", param="adapter_config")
        self.open = Transfer(secrets.token_hex(8), dict(body), size)
        return {"transfer": self.open.id}

    def _chunk(self, body: dict) -> dict:
        transfer = self._transfer(body.get("transfer"))
        offset, data = body.get("offset", ""), body.get("data", b"")
        if not (isinstance(offset, str) and offset.isascii() and offset.isdigit()):
            raise RequestError(f"'offset' must be a whole number of bytes, got {offset!r}", param="offset")
        transfer.put(int(offset), data)
        return {"transfer": transfer.id, "received": sum(map(len, transfer.chunks.values()))}

    def _commit(self, body: dict) -> Transfer:
        transfer = self._transfer(body.get("transfer"))
        self.open = None
        gaps = transfer.missing()
        if gaps:
            shown = ", ".join(f"{a}-{b}" for a, b in gaps[:3])
            raise RequestError(f"transfer {transfer.id} is incomplete: {sum(b - a for a, b in gaps)} of "
                               f"{transfer.size} bytes never came (ranges {shown}); it is dropped and the "
                               "weights served are unchanged", param="transfer")
        transfer.data = b"".join(data for _, data in sorted(transfer.chunks.items()))
        transfer.chunks.clear()
        found = hashlib.sha256(transfer.data).hexdigest()
        if found != transfer.header["sha256"]:
            raise RequestError(f"transfer {transfer.id}: the bytes received have SHA-256 {found}, not "
                               f"{transfer.header['sha256']} as announced (corrupted on the way); it is dropped and "
                               "the weights served are unchanged", param="transfer")
        return transfer

    def _transfer(self, name: object) -> Transfer:
        if self.open is None or name != self.open.id:
            raise RequestError(f"no open transfer {name!r} (a later one replaced it, it was committed, or the server "
                               "restarted): begin it again", 409, "transfer")
        return self.open
