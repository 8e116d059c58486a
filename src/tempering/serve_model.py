"""``temper serve``: a model behind the OpenAI-compatible HTTP server until interrupted.

The server itself is ``tempering.rollout.server``; this command loads the model as the
config says, starts the server on a loopback address and waits.
"""

from __future__ import annotations

import argparse
from typing import Optional

from tempering.config import ConfigError, load_config


def serve_model(args: argparse.Namespace, model_path: Optional[str], config_path: Optional[str],
                overrides: list[str]) -> int:
    """Serve a model over HTTP until interrupted (``tempering.rollout.server``)."""
    import os
    import threading

    import torch

    from tempering.httpd import host_port, is_loopback
    from tempering.policy import load_model
    from tempering.rollout.hf import HFGenerator
    from tempering.rollout.remote import API_KEY_VARIABLE
    from tempering.rollout.server import Limits, start

    api_key = args.api_key or os.environ.get(API_KEY_VARIABLE) or None
    if not is_loopback(args.host) and api_key is None:
        raise ConfigError(f"--host {args.host}: off a loopback address temper serve wants an API key that clients "
                          f"send as 'Authorization: Bearer KEY': pass --api-key KEY (or set ${API_KEY_VARIABLE})")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: a port is 0..65535 (0 = any free one)")
    limits = Limits(*(given if given is not None else default for given, default in
                      ((args.max_request_tokens, Limits.request_tokens), (args.max_queued_tokens, Limits.queued_tokens))))
    if not 1 <= limits.request_tokens <= limits.queued_tokens:
        raise ConfigError(f"--max-request-tokens {limits.request_tokens} --max-queued-tokens {limits.queued_tokens}: "
                          "each must be at least 1, and a request's no more than the queue's")
    config = load_config(config_path, overrides)
    if config.threads:
        torch.set_num_threads(config.threads)
    model, tokenizer, resolved = load_model(config, model_path or config.model.path, progress=not args.quiet)
    rc = config.rollout
    sampler = HFGenerator(model.eval(), tokenizer, config.model.chat_template, rc.batch_size, rc.bf16,
                          share=rc.share_decoding, onednn=rc.onednn)
    try:
        http = start(sampler, args.name or model_path or config.model.path, rc.batch_size, args.host, args.port,
                     limits, api_key)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host_port(args.host, args.port)}: {exc.strerror or exc}") from None
    print(f"temper serve: {resolved} at {http.url} (OpenAI-compatible: {http.url}/v1)", flush=True)
    threading.Event().wait()
    return 0
