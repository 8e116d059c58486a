"""Landlock file-system confinement for the ``landlock`` isolation mode (no mounts needed).

Landlock lets an unprivileged process give up file access for itself and its descendants:
after :func:`confine`, a program may read and execute only beneath the paths it was given,
write only beneath its scratch directory, and (kernel ABI 6 and later) neither signal nor
reach an abstract unix socket outside its own domain. It needs no capability, only
no_new_privs, which is why it is the file-system half of the mode used by root without
CAP_SYS_ADMIN. Imported inside the worker by path, so standard library and ctypes only.
"""

import ctypes
import os
import stat
import struct

_libc = ctypes.CDLL(None, use_errno=True)

# Syscall numbers are the same on every architecture for calls added after 5.x.
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
# Rights a rule on a single file (not a directory) may carry.
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2

READ = EXECUTE | READ_FILE | READ_DIR
DEVICE = READ_FILE | WRITE_FILE


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled."""
    version = _libc.syscall(ctypes.c_long(_CREATE_RULESET), None, ctypes.c_size_t(0),
                            ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(version, 0)


def handled_rights(abi: int) -> int:
    """Every file-system right the kernel's ABI knows: what is not granted is denied.

    >>> handled_rights(1) == (1 << 13) - 1, handled_rights(5) == (1 << 16) - 1
    (True, True)
    """
    rights = (1 << 13) - 1
    for version, right in ((2, REFER), (3, TRUNCATE), (5, IOCTL_DEV)):
        if abi >= version:
            rights |= right
    return rights


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock {what}: {os.strerror(err)}")
    return result


def ruleset(read_paths, device_paths, scratch: str) -> int:
    """A ruleset fd granting ``READ`` beneath ``read_paths``, read and write on
    ``device_paths`` and every right beneath ``scratch``. Paths that do not exist are
    skipped. Opens the paths, so build it while they are still reachable (as root)."""
    abi = abi_version()
    handled = handled_rights(abi)
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("QQQ", handled, 0, scoped) if scoped else struct.pack("Q", handled)
    buffer = ctypes.create_string_buffer(attr, len(attr))
    fd = _check(_libc.syscall(ctypes.c_long(_CREATE_RULESET), buffer, ctypes.c_size_t(len(attr)),
                              ctypes.c_uint32(0)), "create_ruleset")
    grants = [(path, READ) for path in read_paths] + [(path, DEVICE) for path in device_paths]
    for path, rights in grants + [(scratch, handled)]:
        _allow(fd, path, rights & handled)
    return fd


def _allow(ruleset_fd: int, path: str, rights: int) -> None:
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(target).st_mode):
            rights &= _FILE_RIGHTS
        rule = struct.pack("=Qi", rights, target)
        buffer = ctypes.create_string_buffer(rule, len(rule))
        _check(_libc.syscall(ctypes.c_long(_ADD_RULE), ctypes.c_int(ruleset_fd),
                             ctypes.c_int(_RULE_PATH_BENEATH), buffer, ctypes.c_uint32(0)), f"rule {path}")
    finally:
        os.close(target)


def restrict_self(ruleset_fd: int) -> None:
    """Enforce the ruleset on this process and all it starts; needs no_new_privs first."""
    _check(_libc.syscall(ctypes.c_long(_RESTRICT_SELF), ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)),
           "restrict_self")
    os.close(ruleset_fd)
