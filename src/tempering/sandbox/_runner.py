"""The Python fast path: runs a program inside the already-jailed, forked child.

The worker process imports this module once; each job's child (forked, limited, no longer
privileged) calls :func:`run` instead of starting a new interpreter. Everything here runs
beside the untrusted program and is therefore untrusted too: it only reports raw return
values and progress on the result pipe. It never sees expected values and computes no
verdict; the parent does that.

Result pipe messages, one JSON object per line:
``{"start": i}`` before case ``i``; ``{"case": i, "value": <tagged JSON>}`` or
``{"case": i, "error": kind, "message": str}`` after it; ``{"memory_error": true}`` when the
program ran out of memory; ``{"done": true}`` when a whole-program check ran to its end.
"""

import builtins
import io
import json
import os
import random
import sys
import time
import traceback

import _codec

_MESSAGE_CHARS = 2000


# The run's stdin, stdout and stderr, made once in the worker (:func:`prepare_stdio`).
_STDIO = ()


def _stdio_wrappers() -> tuple:
    return (io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace"),
            io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace"),
            io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                             line_buffering=True))


def prepare_stdio() -> None:
    """Make the runs' text streams over descriptors 0-2 once, in the worker, while a pipe
    stands on each as in a run's child (so they take a pipe's properties: not seekable),
    then put the worker's own descriptors back. Each child forked later starts with them
    unused and only installs them: making them in the child cost it 75 page faults (0.4 ms
    of CPU) copied from the worker's memory."""
    global _STDIO
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    read_end, write_end = os.pipe()
    try:
        for fd, end in ((0, read_end), (1, write_end), (2, write_end)):
            os.dup2(end, fd)
        _STDIO = _stdio_wrappers()
    finally:
        for fd, copy in zip((0, 1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(read_end)
        os.close(write_end)


def _reopen_stdio() -> None:
    sys.stdin, sys.stdout, sys.stderr = _STDIO or _stdio_wrappers()
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _line(message: dict) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _send(fd: int, message: dict) -> None:
    _write(fd, _line(message))


def _describe(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text[:_MESSAGE_CHARS]


def _run_cases(namespace: dict, call: dict, result_fd: int) -> None:
    """Report each case; a case's report and the next case's ``start`` go out in one write
    (nothing runs between them), which halves the worker's wake-ups per run."""
    entry = namespace.get(call["entry_point"])
    report = b""
    for index, args_json in call["cases"]:
        _write(result_fd, report + _line({"start": index}))
        try:
            if not callable(entry):
                raise NameError(f"entry point {call['entry_point']!r} is not a defined function")
            value = entry(*_codec.decode(args_json))
            report = _line({"case": index, "value": _codec.encode(value)})
        except MemoryError:
            report = _line({"case": index, "error": "memory_limit", "message": "MemoryError"})
        except BaseException as err:  # a case's failure, SystemExit included, ends only that case
            report = _line({"case": index, "error": "runtime_error", "message": _describe(err)})
    _write(result_fd, report)


def _exit_status(err: SystemExit) -> int:
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code & 0xFF
    print(err.code, file=sys.stderr)
    return 1


def run(code: str, call, check: bool, result_fd: int) -> None:
    """Execute ``code`` as ``__main__`` (or as module ``solution`` for call cases); never returns.

    ``call`` is ``{"entry_point": name, "cases": [[index, args_json], ...]}`` or None;
    ``check`` asks for the ``done`` message after the code ran to its end.
    """
    _reopen_stdio()
    random.seed(0)
    sys.argv = ["solution.py"]
    sys.path.insert(0, os.getcwd())  # as `python solution.py` has it: the program's folder first
    namespace = {"__name__": "solution" if call else "__main__", "__builtins__": builtins,
                 "__file__": "solution.py"}
    status = 0
    try:
        exec(compile(code, "solution.py", "exec"), namespace)
        if call:
            _run_cases(namespace, call, result_fd)
        if check:
            _send(result_fd, {"done": True})
    except SystemExit as err:
        status = _exit_status(err)
    except MemoryError:
        _send(result_fd, {"memory_error": True})
        status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = status or 1
    os._exit(status)


_REHEARSAL = """
def solve(items, k):
    total, seen = 0, {}
    for i, item in enumerate(items):
        if item >= k and item % 2 == 0:
            total += item
        seen[str(item)] = seen.get(str(item), 0) + 1
    text = ",".join(str(x) for x in sorted(set(items)))
    return [total, len(seen), text[:3], [x * 2 for x in items if x < k], max(items or [0])]
"""


def rehearse() -> None:
    """Go through a run's steps once, writing nothing anywhere: a child forked ahead of its
    run calls this while it waits, so the memory a run writes to (objects' reference
    counts, the allocator's arenas, the compiler's and the decoder's state) is copied from
    the worker then rather than page by page while the program runs. Imports nothing new
    and leaves no name or state behind that a program could see."""
    message = json.dumps({"code": _REHEARSAL, "call": {"entry_point": "solve", "cases": [
        [index, json.dumps(_codec.encode([list(range(-3, index)), index]))] for index in range(10)]},
        "check": False, "rlimits": {"cpu_s": 6, "stack": 1 << 24}})
    run = json.loads(message)
    namespace = {"__name__": "solution", "__builtins__": builtins, "__file__": "solution.py"}
    exec(compile(run["code"], "solution.py", "exec"), namespace)
    entry = namespace.get(run["call"]["entry_point"])
    for index, args_json in run["call"]["cases"]:
        _line({"start": index})
        try:
            _line({"case": index, "value": _codec.encode(entry(*_codec.decode(args_json)))})
        except BaseException as err:
            _line({"case": index, "error": "runtime_error", "message": _describe(err)})
    for fd, mode in ((0, "r"), (1, "w"), (2, "w")):
        io.TextIOWrapper(io.FileIO(fd, mode, closefd=False), encoding="utf-8", errors="replace")
    try:
        namespace["solve"](None, 0)
    except TypeError as err:
        _describe(err)


def warm_up() -> float:
    """Import what most programs import, so that forked children start with it loaded."""
    start = time.perf_counter()
    for name in ("collections", "itertools", "functools", "math", "re", "heapq", "bisect",
                 "string", "random", "typing", "fractions", "decimal", "hashlib", "statistics"):
        __import__(name)
    return time.perf_counter() - start
