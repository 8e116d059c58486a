"""The sandbox as a library: run untrusted programs and judge them against tests.

Each program runs in a jailed, pre-forked worker (no network, a read-only root, a private
scratch space, resource limits, a seccomp filter); verdicts are computed here, in the
parent, so a program cannot declare itself correct. See the threat model in the handbook.

    python examples/sandbox_library.py
"""

from tempering import Executor, Limits, RunRequest, SandboxUnavailable, TestSpec, run_code


def main() -> None:
    # One program, one throwaway worker.
    result = run_code("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", stdin="1 2 3\n")
    print("run:", result.status, repr(result.stdout))

    # Many programs: keep a pool and submit in parallel.
    with Executor(workers=2) as sandbox:
        attempts = {
            "right": "def double(x):\n    return 2 * x\n",
            "wrong": "def double(x):\n    return x + 2\n",
            # exits with status 0 before any case runs: still judged a failure, by the parent
            "cheat": "import os\nos._exit(0)\n",
        }
        tests = {"kind": "call", "entry_point": "double",
                 "cases": [{"args": [1], "expected": 2}, {"args": [5], "expected": 10}]}
        specs = [TestSpec.from_dict({"code": code, "tests": tests}) for code in attempts.values()]
        for name, verdict in zip(attempts, sandbox.test_many(specs)):
            print(f"{name}: passed {verdict.passed} of {verdict.total}")

        # Hostile programs end as statuses, not as harm: a busy loop, a memory grab, a connection.
        hostile = ["while True: pass", "block = bytearray(8 << 30)",
                   "import socket\nsocket.create_connection(('1.1.1.1', 53), 2)"]
        requests = [RunRequest(code, limits=Limits(timeout_s=2, memory_mb=256)) for code in hostile]
        for code, result in zip(hostile, sandbox.run_many(requests)):
            print(f"{code.splitlines()[-1]!r}: {result.status}")


if __name__ == "__main__":
    try:
        main()
    except SandboxUnavailable as err:
        raise SystemExit(f"this machine cannot isolate programs: {err}")
