"""``temper sandbox run|test|serve``: argument parsing, and one call into the library each.

Exit status: 0 whenever the sandbox itself worked, whatever the program did; 1 when the
sandbox failed (a ``sandbox_error``); 2 for a usage problem (missing file, bad spec, no
isolation available). ``--json`` output shapes are a contract; see ``spec.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from tempering.sandbox.executor import ISOLATION_MODES, MAX_READY, MAX_WORKERS, Executor
from tempering.sandbox.languages import SUFFIXES
from tempering.sandbox.spec import Limits, RunRequest, SandboxUnavailable, SpecError, TestSpec

TOKEN_VARIABLE = "TEMPER_SANDBOX_TOKEN"
MAX_WORKERS = 64  # the executor's bound
UNISOLATED_WARNING = ("WARNING: --isolation none runs programs UNISOLATED, as this user, with its "
                      "files, network and processes within reach: use it only for code you trust, "
                      "or inside a container or VM")


class UsageError(Exception):
    """A problem with what the user asked for; printed without a traceback."""


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as err:
        raise UsageError(f"cannot read {what} {path!r}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise UsageError(f"{what} {path!r} is not UTF-8 text") from err


def _executor(args) -> Executor:
    """The pool ``--workers`` and ``--isolation`` ask for; a count out of bounds (0 included:
    the default is the flag left out) is a usage error."""
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers {args.workers}: sandbox slots must be between 1 and {MAX_WORKERS} "
                         "(leave it out for one per CPU)")
    if not 0 <= args.ready <= MAX_READY:
        raise UsageError(f"--ready {args.ready}: must be between 0 and {MAX_READY}")
    if args.isolation == "none":
        print(UNISOLATED_WARNING, file=sys.stderr, flush=True)
    try:
        return Executor(workers=args.workers, isolation=args.isolation, ready=args.ready)
    except SandboxUnavailable as err:
        raise UsageError(str(err)) from err


def cmd_run(args) -> int:
    code = _read(args.file, "program")
    language = args.lang or SUFFIXES.get(os.path.splitext(args.file)[1])
    if language is None:
        raise UsageError(f"cannot tell the language of {args.file!r}; pass --lang")
    stdin = _read(args.stdin, "stdin file") if args.stdin else ""
    try:
        request = RunRequest(code, language, stdin, Limits(timeout_s=args.timeout, memory_mb=args.memory_mb))
        with _executor(args) as executor:
            result = executor.run(request)
    except SpecError as err:
        raise UsageError(str(err)) from err
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        print(f"[{result.status}] exit={result.exit_code} signal={result.signal} "
              f"wall={result.wall_s:.3f}s cpu={result.cpu_s:.3f}s", file=sys.stderr)
    return 1 if result.status == "sandbox_error" else 0


def _load_specs(path: str):
    """A file holding one JSON spec, or JSONL with one spec per line (a batch)."""
    text = _read(path, "test spec")
    try:
        return [TestSpec.from_dict(json.loads(text))], False
    except ValueError:
        pass
    specs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            specs.append(TestSpec.from_dict(json.loads(line)))
        except ValueError as err:
            raise UsageError(f"{path}, line {number}: {err}") from err
    if not specs:
        raise UsageError(f"{path} holds no test spec")
    return specs, True


def cmd_test(args) -> int:
    specs, batch = _load_specs(args.spec)
    try:
        with _executor(args) as executor:
            results = executor.test_many(specs)
    except SpecError as err:
        raise UsageError(str(err)) from err
    for result in results:
        if args.json or batch:
            print(json.dumps(result.to_dict()))
        else:
            print(f"{result.status}: {result.passed}/{result.total} cases passed"
                  f" ({result.verdict} verdict)")
            for index, case in enumerate(result.cases):
                print(f"  case {index}: {case.status} {case.wall_s:.3f}s {case.detail[:200]}")
    return 1 if any(result.status == "error" for result in results) else 0


def cmd_serve(args) -> int:
    from tempering.httpd import host_port
    from tempering.sandbox.server import SandboxHTTPServer

    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers must be between 1 and {MAX_WORKERS}, got {args.workers}")
    token = args.token or os.environ.get(TOKEN_VARIABLE) or None
    with _executor(args) as executor:
        try:
            server = SandboxHTTPServer(executor, args.host, args.port, token=token,
                                       max_queue=args.max_queue, max_connections=args.max_connections,
                                       max_memory_mb=args.max_memory_mb)
        except (ValueError, OSError) as err:
            raise UsageError(f"cannot serve on {host_port(args.host, args.port)}: {err}") from err
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        print(f"sandbox serving on {server.url} ({executor.isolation}, {executor.workers} workers, "
              f"at most {args.max_memory_mb} MiB a process)", file=sys.stderr, flush=True)
        if executor.isolation == "none":
            print(f"WARNING: this service runs every client's programs UNISOLATED on {server.url}",
                  file=sys.stderr, flush=True)
        stop.wait()
        server.shutdown()
        server.server_close()
    return 0


def _int_in(low: int, high: int):
    """An argparse type: an integer in [low, high], else a usage error naming the bounds."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low} and {high}")
        return value
    return parse


def _guarded(command):
    def run(args) -> int:
        try:
            return command(args)
        except UsageError as err:
            print(f"temper sandbox {args.sandbox_command}: {err}", file=sys.stderr)
            return 2
    return run


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``sandbox`` with its ``run``, ``test`` and ``serve`` subcommands."""
    parser = subparsers.add_parser("sandbox", help="run untrusted code in the sandbox",
                                   description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workers", type=int, default=None,
                        help=f"sandbox slots, 1 to {MAX_WORKERS} (default: one per CPU)")
    common.add_argument("--ready", type=int, default=0,
                        help=f"children each slot forks ahead of its runs while idle, 0 to {MAX_READY} "
                             "(namespaces isolation; default 0: one fork per run, when it comes)")
    common.add_argument("--isolation", choices=ISOLATION_MODES, default="auto",
                        help="auto picks namespaces (root with CAP_SYS_ADMIN), landlock (root "
                             "without it) or bubblewrap; 'none' runs unisolated (and warns so)")

    run = commands.add_parser("run", parents=[common], help="run one program")
    run.add_argument("file", help="program source")
    run.add_argument("--lang", help="python, cpp, javascript or bash (default: from the suffix)")
    run.add_argument("--stdin", help="file fed to the program's standard input")
    run.add_argument("--timeout", type=float, default=5.0, help="wall-clock seconds (default 5)")
    run.add_argument("--memory-mb", type=int, default=512, help="address space, MiB (default 512)")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.set_defaults(func=_guarded(cmd_run))

    test = commands.add_parser("test", parents=[common], help="run a test spec (or a JSONL batch)")
    test.add_argument("spec", help="SPEC.json, or a .jsonl file with one spec per line")
    test.add_argument("--json", action="store_true", help="print JSON (JSONL for a batch)")
    test.set_defaults(func=_guarded(cmd_test))

    serve = commands.add_parser("serve", parents=[common], help="serve the sandbox over HTTP")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=_int_in(0, 65535), default=8080,
                       help="port (default 8080; 0 picks one)")
    serve.add_argument("--token", help="token clients must send: as 'Authorization: Bearer T', "
                                       f"in the URL as /T/run_code or ?token=T (or ${TOKEN_VARIABLE})")
    serve.add_argument("--max-queue", type=_int_in(1, 1 << 20), default=None,
                       help="jobs held at once, running or waiting, and the largest /run_tests "
                            "batch (default 32 per worker)")
    serve.add_argument("--max-memory-mb", "--memory-mb", dest="max_memory_mb", type=_int_in(16, 65536),
                       default=4096,
                       help="address space per process, MiB: the most a request gets (a larger "
                            "memory_limit_MB is lowered to it) and what memory_limit_MB -1 "
                            "(SandboxFusion's 'unlimited', and every call of its official client) "
                            "gets; default 4096")
    serve.add_argument("--max-connections", type=_int_in(1, 65536), default=256,
                       help="connections served at once; more wait, unanswered, until one "
                            "closes (default 256)")
    serve.set_defaults(func=_guarded(cmd_serve))
    return parser


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="temper")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
