"""Load test of ``temper sandbox serve``: many requests at fixed concurrency, on 127.0.0.1.

Starts the service as a subprocess, sends ``--requests`` programs through
:class:`SandboxClient` from ``--concurrency`` threads, each printing a unique token, and
checks that every request got back exactly its own token. Measures the service's open
file descriptors and its process tree before and after. Prints one JSON object:
throughput, p50/p99 latency, lost/duplicated/crossed results, leaked descriptors and
processes. ``tests/sandbox/test_service.py`` runs a smaller version as a test.

    python bench/sandbox_load.py --requests 2000 --concurrency 32 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from tempering.sandbox import RunRequest, SandboxClient


def start_server(workers: int, token: str | None = None, extra=()):
    """Start ``temper sandbox serve`` on 127.0.0.1 with a free port; return (process, url)."""
    command = [sys.executable, "-m", "tempering.sandbox.cli", "sandbox", "serve",
               "--host", "127.0.0.1", "--port", "0", "--workers", str(workers), *extra]
    if token:
        command += ["--token", token]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    line = process.stderr.readline()
    if "serving on" not in line:
        process.kill()
        raise RuntimeError(f"the sandbox service did not start: {line}{process.stderr.read()}")
    threading.Thread(target=process.stderr.read, daemon=True).start()
    return process, line.split("serving on ", 1)[1].split()[0]


def stop_server(process) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=30)


def process_tree(root: int) -> list:
    """PIDs of ``root``'s descendants, found through /proc parent links."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        tree += children
        frontier += children
    return sorted(tree)


def resources(pid: int) -> dict:
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "processes": len(process_tree(pid))}


def send_load(url: str, requests: int, concurrency: int, token: str | None = None) -> dict:
    """Send the programs, check each answer against its own token, and time them."""
    latencies, answers, errors = [], Counter(), Counter()
    crossed = 0
    lock = threading.Lock()

    def one(index: int, client: SandboxClient) -> None:
        nonlocal crossed
        token_text = f"request-{index}"
        started = time.perf_counter()
        try:
            result = client.run(RunRequest(f"print({token_text!r})"))
        except Exception as err:  # counted and reported, the load goes on
            with lock:
                errors[type(err).__name__] += 1
            return
        elapsed = time.perf_counter() - started
        with lock:
            latencies.append(elapsed)
            answers[result.stdout.strip()] += 1
            crossed += result.stdout.strip() != token_text

    started = time.perf_counter()
    with SandboxClient(url, token=token, concurrency=concurrency) as client:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda i: one(i, client), range(requests)))
    wall = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": requests, "concurrency": concurrency, "wall_s": round(wall, 3),
        "throughput_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(1000 * statistics.median(latencies), 2) if latencies else None,
        "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 2) if latencies else None,
        "answered": len(latencies),
        "lost": requests - sum(answers[f"request-{i}"] > 0 for i in range(requests)),
        "duplicated": sum(count - 1 for count in answers.values() if count > 1),
        "crossed": crossed, "errors": dict(errors),
    }


def run_load_test(requests: int, concurrency: int, workers: int) -> dict:
    process, url = start_server(workers)
    try:
        with SandboxClient(url) as client:
            client.health()
        time.sleep(0.5)  # the health check's connection thread ends
        before = resources(process.pid)
        report = send_load(url, requests, concurrency)
        time.sleep(0.5)  # let the server's connection threads notice the closed sockets
        after = resources(process.pid)
    finally:
        exit_status = stop_server(process)
    report.update(workers=workers, fds_before=before["fds"], fds_after=after["fds"],
                  leaked_fds=after["fds"] - before["fds"],
                  processes_before=before["processes"], processes_after=after["processes"],
                  leaked_processes=after["processes"] - before["processes"],
                  server_pid=process.pid, server_exit_status=exit_status)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    print(json.dumps(run_load_test(args.requests, args.concurrency, args.workers)))


if __name__ == "__main__":
    main()
