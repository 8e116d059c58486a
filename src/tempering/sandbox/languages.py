"""Languages the sandbox runs, as plain data: file name, compile step, run command.

Python takes the fast path (the forked worker runs the code in-process, no new
interpreter); the others compile (C++) or start their runtime (node, bash) inside the same
jail. A language is offered only when its tools exist on this machine.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Optional

from tempering.sandbox.spec import SpecError


@dataclass(frozen=True)
class Language:
    name: str
    filename: str
    tool: Optional[str] = None  # executable found on PATH; None for the Python fast path
    compile_args: tuple = ()  # after the compiler path; empty when there is no compile step
    run_args: tuple = ()  # the run command after the tool (or the binary when compiled)
    # Extra address space for runtimes that reserve large virtual ranges up front (V8);
    # their real heap is capped by their own flag instead.
    extra_address_space_mb: int = 0
    compile_timeout_s: float = 30.0
    compile_memory_mb: int = 2048

    def tool_path(self) -> Optional[str]:
        return shutil.which(self.tool) if self.tool else None

    def available(self) -> bool:
        return self.tool is None or self.tool_path() is not None

    def compile_argv(self) -> Optional[list]:
        if not self.compile_args:
            return None
        return [self.tool_path(), *self.compile_args]

    def run_argv(self, memory_mb: int) -> Optional[list]:
        """The command for one run, or None for the in-process Python path."""
        if self.tool is None:
            return None
        if self.compile_args:
            return list(self.run_args)
        args = [arg.format(memory_mb=memory_mb) for arg in self.run_args]
        return [self.tool_path(), *args]


LANGUAGES = {
    "python": Language("python", "solution.py"),
    "cpp": Language("cpp", "solution.cpp", "g++",
                    compile_args=("-O2", "-std=c++17", "-pipe", "-o", "solution", "solution.cpp"),
                    run_args=("./solution",)),
    "javascript": Language("javascript", "solution.js", "node",
                           run_args=("--max-old-space-size={memory_mb}", "solution.js"),
                           extra_address_space_mb=4096),
    "bash": Language("bash", "solution.sh", "bash", run_args=("solution.sh",)),
}
ALIASES = {"python3": "python", "py": "python", "c++": "cpp", "cxx": "cpp", "js": "javascript",
           "node": "javascript", "nodejs": "javascript", "sh": "bash"}
SUFFIXES = {".py": "python", ".cpp": "cpp", ".cc": "cpp", ".cxx": "cpp", ".js": "javascript",
            ".mjs": "javascript", ".sh": "bash"}


def get_language(name: str) -> Language:
    """Look a language up by name or alias; the error lists what this machine offers."""
    key = ALIASES.get(name.lower(), name.lower())
    language = LANGUAGES.get(key)
    if language is None or not language.available():
        offered = ", ".join(n for n, lang in LANGUAGES.items() if lang.available())
        reason = "is not installed here" if language else "is not supported"
        raise SpecError(f"language {name!r} {reason}; available: {offered}")
    return language
