"""Which filesystem a directory is on, from ``/proc/self/mountinfo``: the queue refuses a
network filesystem, where SQLite's locks do not work ("SQLite depends on the underlying
filesystem to do locking ... network filesystems ... have bugs": https://www.sqlite.org/faq.html,
question 5).

:func:`filesystem_of` is pure (the file's text comes in); :func:`filesystem_type` reads it,
from ``$XPULAUNCH_PROCFS_ROOT/self/mountinfo`` in tests, as the probe's fake machines do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# Filesystems that are not one host's own: NFS, SMB, AFS and the cluster filesystems, and
# FUSE mounts of remote stores, where locks do not reach the server or not reliably.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "afs",
        "ncpfs",
        "9p",
        "ceph",
        "lustre",
        "gpfs",
        "beegfs",
        "glusterfs",
        "orangefs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.rclone",
        "fuse.juicefs",
        "fuse.cephfs",
        "davfs",
        "fuse.davfs2",
    }
)
_OCTAL = re.compile(r"\\([0-7]{3})")


def filesystem_of(mountinfo: str, path: str) -> str | None:
    """The filesystem type of the mount holding the absolute ``path`` (None: no mount found).

    Each line of mountinfo is ``ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS...] - TYPE
    SOURCE SUPEROPTIONS`` (proc(5)); the longest mount point that contains ``path`` wins, and
    of two at one mount point the later line (the one mounted over the other)."""
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields or len(fields) < 7:
            continue
        mount_point = _unescape(fields[4])
        fs_type = fields[fields.index("-") + 1]
        if _contains(mount_point, path) and (best is None or len(mount_point) >= best[0]):
            best = (len(mount_point), fs_type)
    return None if best is None else best[1]


def filesystem_type(path: str, env: Mapping[str, str]) -> str | None:
    """The filesystem type of ``path`` (resolved) on this host; None when unknown."""
    root = env.get("XPULAUNCH_PROCFS_ROOT") or "/proc"
    try:
        with open(os.path.join(root, "self", "mountinfo"), encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    return filesystem_of(text, os.path.realpath(path))


def is_network(fs_type: str | None) -> bool:
    return fs_type is not None and fs_type.lower() in NETWORK_FILESYSTEMS


def _contains(mount_point: str, path: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)
