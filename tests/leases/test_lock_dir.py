"""The lock directory: private default (0700, ours), shared mode, filesystems without locks."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from xpulaunch.errors import LeaseError
from xpulaunch.leases import LeaseManager
from xpulaunch.leases.lock_directory import LockDirectory
from xpulaunch.model import Inventory

PlanFor = Callable[..., Any]  # the plan_for fixture (tests/leases/conftest.py)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_default_is_under_xdg_runtime_dir_and_private(
    tmp_path: Path, inventory: Inventory, plan_for: PlanFor, loose_umask: None
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    manager = LeaseManager(env={"XDG_RUNTIME_DIR": str(runtime)})
    assert manager.lock_dir == runtime / "xpulaunch"
    _plan, lease = manager.allocate(plan_for(inventory, "1"))
    with lease:
        st = os.lstat(manager.lock_dir)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
        for name in os.listdir(manager.lock_dir):
            assert _mode(manager.lock_dir / name) == 0o600, name


def test_default_falls_back_to_tmp_per_uid(tmp_path: Path) -> None:
    for env in ({}, {"XDG_RUNTIME_DIR": "relative/dir"}, {"XDG_RUNTIME_DIR": "/nonexistent"}):
        directory = LockDirectory.default(env, uid=1234, tmp_root=tmp_path)
        assert directory.path == tmp_path / "xpulaunch-1234"
        assert not directory.shared


def test_private_dir_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "xpulaunch-1"
    path.mkdir(mode=0o700)
    other = LockDirectory(path, shared=False, owner_uid=os.getuid() + 1)
    with pytest.raises(LeaseError, match=r"belongs to uid \d+, not to you .*--lock-dir"):
        other.ensure(create=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_really_foreign_owned_default_dir_is_refused(
    tmp_path: Path, one_card: Inventory, plan_for: PlanFor
) -> None:
    runtime = tmp_path / "run"
    (runtime / "xpulaunch").mkdir(parents=True, mode=0o700)
    os.chown(runtime / "xpulaunch", 65534, 65534)
    manager = LeaseManager(env={"XDG_RUNTIME_DIR": str(runtime)})
    with pytest.raises(LeaseError, match="belongs to uid 65534"):
        manager.allocate(plan_for(one_card, "1"))
    with pytest.raises(LeaseError, match="belongs to uid 65534"):
        manager.status()


def test_symlinked_private_dir_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "xpulaunch-7").symlink_to(target)
    directory = LockDirectory(tmp_path / "xpulaunch-7", shared=False, owner_uid=os.getuid())
    with pytest.raises(LeaseError, match="is not a directory"):
        directory.ensure(create=True)


def test_group_writable_private_dir_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "xpulaunch-7"
    path.mkdir()
    path.chmod(0o770)
    directory = LockDirectory(path, shared=False, owner_uid=os.getuid())
    with pytest.raises(LeaseError, match=r"has mode 0770.*chmod 700"):
        directory.ensure(create=False)
    assert _mode(path) == 0o770  # left for the user to check


def test_world_readable_private_dir_is_closed_up(tmp_path: Path) -> None:
    path = tmp_path / "xpulaunch-7"
    path.mkdir()
    path.chmod(0o755)
    assert LockDirectory(path, shared=False, owner_uid=os.getuid()).ensure(create=False)
    assert _mode(path) == 0o700


def test_status_does_not_create_the_directory(tmp_path: Path) -> None:
    report = LeaseManager(tmp_path / "nothing-here").status()
    assert not report.exists and report.leases == () and report.waiting == ()
    assert not (tmp_path / "nothing-here").exists()


def test_shared_dir_and_its_files_are_usable_by_everyone(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor, loose_umask: None
) -> None:
    manager = LeaseManager(lock_dir)
    _plan, lease = manager.allocate(plan_for(inventory, "1"))
    with lease:
        assert _mode(lock_dir) == 0o1777
        for name in os.listdir(lock_dir):
            assert _mode(lock_dir / name) == 0o666, name


def test_shared_dir_needs_an_existing_parent(
    tmp_path: Path, one_card: Inventory, plan_for: PlanFor
) -> None:
    with pytest.raises(LeaseError, match=r"cannot create lock directory .*missing/locks"):
        LeaseManager(tmp_path / "missing" / "locks").allocate(plan_for(one_card, "1"))


def test_lock_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(LeaseError, match="is not a directory"):
        LeaseManager(tmp_path / "file").status()


def test_planted_fifo_does_not_hang_and_is_refused(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor
) -> None:
    lock_dir.mkdir()
    os.mkfifo(lock_dir / "unit-0000%3A01%3A00.0.lock")
    with pytest.raises(LeaseError, match="not a regular file"):
        LeaseManager(lock_dir).allocate(plan_for(inventory, "device=0000:01:00.0"))


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL])
def test_filesystem_without_locks_gets_one_clear_error(
    code: int,
    lock_dir: Path,
    inventory: Inventory,
    plan_for: PlanFor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    manager = LeaseManager(lock_dir)
    for call in (lambda: manager.allocate(plan_for(inventory, "1")), manager.status):
        with pytest.raises(LeaseError) as info:
            call()
        message = info.value.message
        assert str(lock_dir) in message and "does not support file locks" in message
        assert "--lock-dir" in message and "local filesystem" in message


def test_filesystem_failing_only_the_unit_locks_is_reported(
    lock_dir: Path, inventory: Inventory, plan_for: PlanFor, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_flock = fcntl.flock

    def nonblocking_fails(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_NB:
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", nonblocking_fails)
    with pytest.raises(LeaseError, match="does not support file locks"):
        LeaseManager(lock_dir).allocate(plan_for(inventory, "1"))
    assert not [n for n in os.listdir(lock_dir) if n.endswith(".holder")]
