"""Run a command as an unprivileged user, from root, seeing the paths it needs.

    python as_unprivileged.py USER PATH[:PATH...] COMMAND [ARG ...]

The Python installation, its environment and the checkout a test run needs may lie under a
directory only root may walk (a pyenv Python under /root, say). In a private mount
namespace each such directory is covered by an empty tmpfs that anyone may walk, holding
only the needed PATHs, bound back at their own paths; then the command runs as USER with
no supplementary groups and no capabilities. The host's directories and their modes are
not changed, and nothing else under them becomes visible. Needs root with CAP_SYS_ADMIN.
"""

import os
import pwd
import sys

from tempering.sandbox import _jail


def _unwalkable_ancestor(path: str):
    """The first directory on the way to ``path`` that other users may not walk, or None."""
    parts = path.rstrip("/").split("/")
    for i in range(2, len(parts)):
        ancestor = "/".join(parts[:i])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def expose(paths) -> None:
    """Cover each unwalkable ancestor of ``paths`` with a walkable tmpfs holding ``paths``."""
    covers, kept = {}, []
    for path in sorted(paths):
        if any(path.startswith(outer + "/") for outer in kept):
            continue  # bound with the directory that holds it
        kept.append(path)
        ancestor = _unwalkable_ancestor(path)
        if ancestor is not None:
            covers.setdefault(ancestor, []).append(path)
    for ancestor, inside in covers.items():
        # The originals stay reachable through a descriptor opened before the cover.
        original = os.open(ancestor, os.O_PATH | os.O_DIRECTORY)
        _jail.mount("tmpfs", ancestor, "tmpfs", _jail.MS_NOSUID | _jail.MS_NODEV, "size=64k,mode=755")
        for path in inside:
            os.makedirs(path, exist_ok=True)
            source = f"/proc/self/fd/{original}/{os.path.relpath(path, ancestor)}"
            _jail.mount(source, path, None, _jail.MS_BIND | _jail.MS_REC)
        os.close(original)


def main() -> None:
    user, paths, command = sys.argv[1], sys.argv[2].split(":"), sys.argv[3:]
    entry = pwd.getpwnam(user)
    _jail.unshare(_jail.CLONE_NEWNS)
    _jail.mount(None, "/", None, _jail.MS_REC | _jail.MS_PRIVATE)
    expose([os.path.realpath(path) for path in paths])
    os.setgroups([])
    os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
    os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
