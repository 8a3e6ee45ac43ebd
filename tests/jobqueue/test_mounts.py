"""Which filesystem the lock directory is on (mountinfo, proc(5)): a network one is refused."""

from __future__ import annotations

import pytest

from xpulaunch.jobqueue.mounts import filesystem_of, is_network

MOUNTINFO = """\
22 1 0:21 / / rw,relatime shared:1 - overlay overlay rw,lowerdir=/a
30 22 0:27 / /tmp rw,nosuid shared:2 - tmpfs tmpfs rw
41 22 0:40 / /home rw,relatime shared:5 - ext4 /dev/sda2 rw
52 41 0:45 / /home/lab rw,relatime shared:6 - nfs4 srv:/export/lab rw,vers=4.2
53 30 0:46 / /tmp/with\\040space rw - cifs //srv/share rw
"""


@pytest.mark.parametrize(
    ("path", "fs_type"),
    [
        ("/", "overlay"),
        ("/usr/lib", "overlay"),
        ("/tmp", "tmpfs"),
        ("/tmpfoo", "overlay"),  # a prefix of the name is not a parent directory
        ("/home/alice", "ext4"),
        ("/home/lab", "nfs4"),
        ("/home/lab/locks", "nfs4"),
        ("/tmp/with space/locks", "cifs"),
    ],
)
def test_longest_mount_point_wins(path: str, fs_type: str) -> None:
    assert filesystem_of(MOUNTINFO, path) == fs_type


def test_a_later_mount_over_the_same_point_wins() -> None:
    text = MOUNTINFO + "60 30 0:50 / /tmp rw - nfs srv:/t rw\n"
    assert filesystem_of(text, "/tmp/x") == "nfs"


def test_malformed_lines_are_skipped() -> None:
    assert filesystem_of("garbage\n\n1 2 3\n", "/x") is None


@pytest.mark.parametrize(
    ("fs_type", "network"),
    [("nfs4", True), ("NFS", True), ("cifs", True), ("fuse.sshfs", True), ("ext4", False),
     ("tmpfs", False), ("overlay", False), (None, False)],
)  # fmt: skip
def test_network_filesystems(fs_type: str | None, network: bool) -> None:
    assert is_network(fs_type) is network
