"""Where this process's cgroup v2 lives, from /proc/self/mountinfo and /proc/self/cgroup."""

from __future__ import annotations

from xpulaunch.processes.cgroup import own_cgroup_dir

UNIFIED = (
    "35 25 0:30 / /sys/fs/cgroup type cgroup2 rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    "36 25 0:31 / /proc rw - proc proc rw\n"
)
HYBRID = (
    "40 30 0:35 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "41 30 0:36 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
)


def test_a_systemd_user_scope_on_a_unified_host() -> None:
    own = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope\n"
    assert own_cgroup_dir(UNIFIED, own) == (
        "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope"
    )


def test_the_root_of_a_hybrid_host() -> None:
    own = "4:memory:/docker/abc\n0::/\n"
    assert own_cgroup_dir(HYBRID, own) == "/sys/fs/cgroup/unified"


def test_no_cgroup2_mount_or_no_v2_line() -> None:
    assert own_cgroup_dir("", "0::/\n") is None
    assert own_cgroup_dir(UNIFIED, "4:memory:/x\n") is None
    assert own_cgroup_dir(UNIFIED, "0::/gone (deleted)\n") is None
