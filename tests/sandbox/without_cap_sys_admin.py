"""Run a command as root without CAP_SYS_ADMIN, as in a default Docker container.

    python without_cap_sys_admin.py COMMAND [ARG ...]

Drops CAP_SYS_ADMIN from the bounding set, then execs the command: the kernel gives a
root process exactly its bounding set on exec, so the command and everything it starts
have every capability but CAP_SYS_ADMIN and cannot get it back. Needs no package (capsh
does the same with --drop=cap_sys_admin).
"""

import ctypes
import os
import sys

PR_CAPBSET_DROP = 24
CAP_SYS_ADMIN = 21


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) != 0:
        sys.exit(f"cannot drop CAP_SYS_ADMIN: {os.strerror(ctypes.get_errno())}")
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
