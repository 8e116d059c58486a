"""Languages the sandbox runs, as plain data: file name, compile step, run command.

Python takes the fast path (the forked worker runs the code in-process, no new
interpreter); the others compile (C++, Java) or start their runtime (node, bash, pytest)
inside the same jail. A language is offered only when its tools exist on this machine
where the jail can see them: beneath /usr or the Python installation (a compiler under
/root or /opt is not mounted there). Java takes a JDK whose files all lie beneath /usr:
distribution JDKs that link their security configuration into /etc (Debian's openjdk)
cannot start in the jail, which mounts only a few /etc files. In ``landlock`` mode a started
tool must also be reachable by every user (no jail remounts it): pytest, which starts the
environment's Python, fails to start there when that environment lies under a private
home such as /root.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Optional

from tempering.sandbox import _jail
from tempering.sandbox.spec import SpecError

# The JVM reserves address space far beyond its heap (code cache, class space, one malloc
# arena per thread); its heap is capped by -Xmx, these bound the rest.
_JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:ReservedCodeCacheSize=64m",
              "-XX:CompressedClassSpaceSize=64m", "-XX:MaxMetaspaceSize=256m")


def _visible(path: str) -> bool:
    """Whether ``path`` lies where the jail mounts the host's files."""
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root.rstrip("/") + "/")
               for root in ("/usr", *_jail.python_paths()))


def find_tool(name: str) -> Optional[str]:
    """The program ``name`` (a command on PATH or an absolute path) as the jail can run it."""
    path = shutil.which(name)
    return path if path and _visible(path) else None


def _jdk_home() -> Optional[str]:
    """``$JAVA_HOME``, else the newest JDK under /usr/lib/jvm, that the jail can run whole."""
    homes = [os.environ.get("JAVA_HOME", "")] + sorted(glob.glob("/usr/lib/jvm/*"), reverse=True)
    for home in homes:
        needed = [os.path.join(home, "bin", tool) for tool in ("javac", "java")]
        needed.append(os.path.join(home, "conf", "security", "java.security"))
        if home and all(os.path.exists(path) and _visible(path) for path in needed):
            return home
    return None


@dataclass(frozen=True)
class Language:
    name: str
    filename: str
    tool: Optional[str] = None  # executable on PATH or absolute; None for the Python fast path
    compile_args: tuple = ()  # after the compiler path; empty when there is no compile step
    run_args: tuple = ()  # the run command after the tool (or the binary when compiled)
    # Extra address space for runtimes that reserve large virtual ranges up front (V8, the
    # JVM); their real heap is capped by their own flag instead.
    extra_address_space_mb: int = 0
    compile_timeout_s: float = 30.0
    compile_memory_mb: int = 2048
    run_tool: Optional[str] = None  # runs the compiled program (java); None: it runs itself
    module: Optional[str] = None  # a Python module the run needs (pytest)

    def tool_path(self) -> Optional[str]:
        return find_tool(self.tool) if self.tool else None

    def available(self) -> bool:
        if self.tool is None:
            return True
        if self.tool_path() is None or (self.run_tool and find_tool(self.run_tool) is None):
            return False
        return self.module is None or importlib.util.find_spec(self.module) is not None

    def compile_argv(self) -> Optional[list]:
        if not self.compile_args:
            return None
        return [self.tool_path(), *self.compile_args]

    def run_argv(self, memory_mb: int) -> Optional[list]:
        """The command for one run, or None for the in-process Python path."""
        if self.tool is None:
            return None
        args = [arg.format(memory_mb=memory_mb) for arg in self.run_args]
        if self.run_tool:
            return [find_tool(self.run_tool), *args]
        if self.compile_args:
            return args
        return [self.tool_path(), *args]


# Without a JDK the jail can run, a path that is never found: java is then not offered.
_JDK = _jdk_home() or "/no-usable-jdk"
LANGUAGES = {
    "python": Language("python", "solution.py"),
    "cpp": Language("cpp", "solution.cpp", "g++",
                    compile_args=("-O2", "-std=c++17", "-pipe", "-o", "solution", "solution.cpp"),
                    run_args=("./solution",)),
    "javascript": Language("javascript", "solution.js", "node",
                           run_args=("--max-old-space-size={memory_mb}", "solution.js"),
                           extra_address_space_mb=4096),
    "bash": Language("bash", "solution.sh", "bash", run_args=("solution.sh",)),
    # As SandboxFusion runs Java: class Main in Main.java, assertions on.
    "java": Language("java", "Main.java", f"{_JDK}/bin/javac",
                     compile_args=("-J-Xmx256m", "-J-XX:TieredStopAtLevel=1",
                                   *(f"-J{flag}" for flag in _JVM_FLAGS),
                                   "-encoding", "UTF-8", "-d", ".", "Main.java"),
                     run_tool=f"{_JDK}/bin/java",
                     run_args=("-Xmx{memory_mb}m", *_JVM_FLAGS, "-ea", "-cp", ".", "Main"),
                     extra_address_space_mb=1024),
    # Test functions in the program, run by the environment's pytest (SandboxFusion's pytest).
    "pytest": Language("pytest", "test_solution.py", sys.executable,
                       run_args=("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_solution.py"),
                       module="pytest"),
}
ALIASES = {"python3": "python", "py": "python", "c++": "cpp", "cxx": "cpp", "js": "javascript",
           "node": "javascript", "nodejs": "javascript", "sh": "bash"}
SUFFIXES = {".py": "python", ".cpp": "cpp", ".cc": "cpp", ".cxx": "cpp", ".js": "javascript",
            ".mjs": "javascript", ".sh": "bash", ".java": "java"}


def offered() -> list:
    """The names of the languages this machine runs."""
    return [name for name, language in LANGUAGES.items() if language.available()]


def is_known(name: str) -> bool:
    """Whether ``name`` (or an alias) is a language of this sandbox, installed here or not: a
    service elsewhere may run what this machine cannot."""
    return ALIASES.get(name.lower(), name.lower()) in LANGUAGES


def get_language(name: str) -> Language:
    """Look a language up by name or alias; the error lists what this machine offers."""
    key = ALIASES.get(name.lower(), name.lower())
    language = LANGUAGES.get(key)
    if language is None or not language.available():
        reason = "is not installed here" if language else "is not supported"
        raise SpecError(f"language {name!r} {reason}; available: {', '.join(offered())}")
    return language
