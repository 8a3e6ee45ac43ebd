"""Reading other processes: the one place that looks at ``/proc``.

Everything in xpulaunch that asks about a process it did not just spawn asks here: the engine
(which processes of a job are left, by session id and by the ``XPULAUNCH_JOB_ID`` marker), the
record sweep, the guardian's last-resort stage, and lease/queue liveness. So every side agrees
on what "a process of the job" is.

Identity across pid reuse is ``(pid, start_ticks)``: the start time in clock ticks after boot
that the kernel keeps in /proc/PID/stat (field 22), which never changes for a process. Wall-clock
start times (``btime`` + ticks, what psutil's ``create_time()`` returns) move when the clock is
stepped (psutil issues #1724 and #2526), and these identities are written to files that a later
process compares, so ticks it is. That is also why this is a small /proc reader and not psutil:
psutil keeps the tick-based start time private, has no session id, and the guardian's last
stage runs without site-packages (see :mod:`xpulaunch.processes.guardian`), so this module imports
only the standard library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.model import JOB_ID_VAR, WORKER_VAR

if TYPE_CHECKING:
    import socket
    from collections.abc import Collection, Iterator, Mapping

# /proc/PID/stat is 52 numbers and a command name of at most 64 bytes (TASK_COMM_LEN 16,
# escaped): well under 1 KiB.
_STAT_MAX_BYTES = 4096
_GONE_STATES = frozenset("ZXx")  # zombie / dead: it holds no resources but a pid


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """The fields of /proc/PID/stat that xpulaunch uses."""

    pid: int
    state: str  # one letter: R, S, D, T, Z, ...
    ppid: int
    pgid: int
    sid: int
    start_ticks: int  # clock ticks after boot: with the pid, the process's identity

    @property
    def gone(self) -> bool:
        """A zombie or dead process: it holds nothing but its pid."""
        return self.state in _GONE_STATES


@dataclass(frozen=True, slots=True)
class JobProcess:
    """A live process of a job, and the worker it belongs to by its marker (if any)."""

    info: ProcessInfo
    worker: str | None


def process_info(pid: int) -> ProcessInfo | None:
    """Parse /proc/PID/stat; None when the process is gone."""
    # os.read, not open(): a scan reads this for every process of the host.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:  # gone between listing and reading (ENOENT/ESRCH)
        return None
    try:
        raw = os.read(fd, _STAT_MAX_BYTES)  # one read: the kernel writes it in one go
    except OSError:  # gone while reading (ESRCH)
        return None
    finally:
        os.close(fd)
    # The command name (field 2) is in parentheses and may itself hold spaces and ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        return None
    ppid, pgid, sid = int(fields[1]), int(fields[2]), int(fields[3])
    return ProcessInfo(pid, fields[0].decode(), ppid, pgid, sid, int(fields[19]))


def process_environ(pid: int) -> dict[str, str]:
    """The environment a process was started with; empty when unreadable or gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:  # gone, or another user's process (EACCES)
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0"))
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, sep, v in pairs if sep}


def start_ticks(pid: int) -> int | None:
    """The start time of a live (not zombie) ``pid``: with the pid, its identity."""
    info = process_info(pid)
    return None if info is None or info.gone else info.start_ticks


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (state T) or a tracer (t)."""
    info = process_info(pid)
    return info is not None and info.state in ("T", "t")


def is_running(pid: int, ticks: int) -> bool:
    """Whether the process ``(pid, ticks)`` still runs (a reused pid has other ticks)."""
    return start_ticks(pid) == ticks


def now_ticks() -> int:
    """The current time in the units of ``ProcessInfo.start_ticks``."""
    with open("/proc/uptime", "rb") as handle:
        uptime_s = float(handle.read().split()[0])
    # /proc/uptime has 10 ms resolution; one tick of margin so nothing started "now" is missed.
    return max(int(uptime_s * os.sysconf("SC_CLK_TCK")) - 1, 0)


def start_time_s(pid: int) -> float | None:
    """When a live ``pid`` started, in seconds since the epoch (for people, not identity:
    it moves with the wall clock, as psutil's ``create_time()`` does)."""
    ticks, boot_s = start_ticks(pid), boot_time_s()
    if ticks is None or boot_s is None:
        return None
    return boot_s + ticks / os.sysconf("SC_CLK_TCK")


def boot_time_s() -> float | None:
    """The boot time in seconds since the epoch (/proc/stat ``btime``)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            for line in stat:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def iter_processes(uid: int, since_ticks: int = 0) -> Iterator[ProcessInfo]:
    """Every live (not zombie) process of ``uid`` started at or after ``since_ticks``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        info = process_info(int(entry.name))
        if info is None or info.gone or info.start_ticks < since_ticks:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
        except OSError:  # exited while we looked
            continue
        yield info


def find_job(
    job_id: str | None,
    sessions: Mapping[int, int],
    *,
    since_ticks: int = 0,
    exclude: frozenset[int] = frozenset(),
    cgroup: str | None = None,
) -> list[JobProcess]:
    """Live processes of a job: members of its workers' sessions, or carrying its marker.

    ``sessions`` maps a worker's session id to its leader's start ticks. A session whose id
    was reused by a newer process is not ours (the kernel frees a pid only once no process
    uses it as session id, so a live leader with other start ticks means reuse). Only
    processes started at or after ``since_ticks`` are looked at: the job started then, so
    every process of it, in its workers' sessions or carrying its marker, was forked after.
    """
    ours = {sid for sid, ticks in sessions.items() if _session_is_ours(sid, ticks)}
    found = []
    for info in iter_processes(os.getuid(), since_ticks):
        if info.pid in exclude or info.pid <= 1:
            continue
        env = process_environ(info.pid)
        marked = job_id is not None and env.get(JOB_ID_VAR) == job_id
        if marked or info.sid in ours:
            found.append(JobProcess(info, env.get(WORKER_VAR)))
    if cgroup is not None:  # members of the job's cgroup, whatever their session, marker, user
        found += _cgroup_members(cgroup, {p.info.pid for p in found} | exclude)
    return found


def _cgroup_members(cgroup: str, skip: set[int] | frozenset[int]) -> list[JobProcess]:
    from xpulaunch.processes.cgroup import JobCgroup

    found = []
    for pid, worker in JobCgroup(cgroup).members().items():
        info = process_info(pid) if pid not in skip and pid > 1 else None
        if info is not None and not info.gone:
            found.append(JobProcess(info, worker))
    return found


def _session_is_ours(sid: int, leader_ticks: int) -> bool:
    leader = process_info(sid)
    return leader is None or leader.start_ticks == leader_ticks


def flock_sharers(
    fds: Collection[int],
    *,
    exclude: frozenset[int] = frozenset(),
    since_ticks: int = 0,
) -> dict[int, set[tuple[int, int]]]:
    """Processes holding a descriptor that shares the flock'd open file description of one of
    our ``fds``: pid -> those files' ``(st_dev, st_ino)``. Processes in ``exclude``, those
    started before ``since_ticks`` (a job's descriptors reach only processes forked after it
    started) and other users' (their descriptors are not ours to read, and a lease's are
    inherited only by our own descendants) are skipped.

    A descriptor of the same file that another process opened itself is a different open
    file description and holds no part of our lock: ``/proc/PID/fdinfo/FD`` lists a lock only
    for the description that owns it (proc(5), "lock:" lines). Such a description may hold a
    lock of its own, though: jobs sharing a device each hold a shared lock of its lock file.
    So a descriptor counts only when it lists our lock, the same line as ours (a flock names
    the process that took it).
    """
    wanted: dict[tuple[int, int], tuple[bytes, ...]] = {}
    for fd in fds:
        ours = _locks_listed(f"/proc/self/fdinfo/{fd}")
        if ours:
            st = os.fstat(fd)
            wanted[(st.st_dev, st.st_ino)] = ours[0]
    found: dict[int, set[tuple[int, int]]] = {}
    if not wanted:
        return found
    for info in iter_processes(os.getuid(), since_ticks):
        if info.pid in exclude or info.pid <= 1:
            continue
        held = _flocked_inodes(info.pid, wanted)
        if held:
            found[info.pid] = held
    return found


def _flocked_inodes(
    pid: int, wanted: Mapping[tuple[int, int], tuple[bytes, ...]]
) -> set[tuple[int, int]]:
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:  # gone, or not ours to read
        return set()
    held = set()
    for name in names:
        try:
            st = os.stat(os.path.join(fd_dir, name))  # follows the link to the open file
        except OSError:
            continue
        inode = (st.st_dev, st.st_ino)
        if inode in wanted and wanted[inode] in _locks_listed(f"/proc/{pid}/fdinfo/{name}"):
            held.add(inode)
    return held


def _locks_listed(fdinfo: str) -> list[tuple[bytes, ...]]:
    """The locks an fdinfo file lists, without their ordinal: ``(b"FLOCK", b"ADVISORY",
    b"READ", b"1234", b"fe:00:5678", b"0", b"EOF")``, the lock's kind, type, the pid that
    took it and the file."""
    try:
        with open(fdinfo, "rb") as handle:
            lines = handle.read(65536).splitlines()
    except OSError:
        return []
    return [tuple(line.split()[2:]) for line in lines if line.startswith(b"lock:")]


def command_line(pid: int, width: int = 80) -> str:
    """``sleep 300``: a process's command line for a message ("?" when unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read(4096).split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    return (text[: width - 3] + "...") if len(text) > width else text or "?"


# -- sockets -------------------------------------------------------------------------------------
# /proc/net/tcp and tcp6 (proc(5)): "sl local_address rem_address st tx:rx tr:when retrnsmt uid
# timeout inode ...", addresses in hex; state 0A is TCP_LISTEN (include/net/tcp_states.h).
_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"
_SOCKET_LINK = "socket:["

# The same table by netlink (sock_diag(7), what ss(8) reads), asked for listening sockets
# only, so the kernel walks those alone; /proc/net/tcp lists every connection of the network
# namespace as well. After a router's bursts thousands of them wait in TIME_WAIT, and reading
# the whole table at each of its servers' health checks (every 2 s) took the router's process
# 16-33 ms of holding the interpreter, while its event loop waited. linux/sock_diag.h,
# linux/inet_diag.h, linux/netlink.h:
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300  # NLM_F_REQUEST | NLM_F_DUMP
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_NLMSG_HEADER = "=IHHII"  # struct nlmsghdr: length, type, flags, sequence, port id
_DIAG_REQUEST = "=BBBBI48x"  # inet_diag_req_v2: family, protocol, ext, pad, states; sockid 0
_DIAG_MESSAGE_BYTES = 72  # struct inet_diag_msg; its sockid from byte 4, the inode at 68


def listening_sockets(port: int) -> dict[int, str]:
    """Inode -> address of every TCP socket listening on ``port`` in this process's network
    namespace (IPv4 and IPv6): by netlink, else from ``/proc/net/tcp``. Raises ``OSError``
    when neither can be read."""
    try:
        return _listening_by_netlink(port)
    except OSError:  # no netlink here (a sandbox's kernel): the table in /proc
        return _listening_in_proc(port)


def _listening_by_netlink(port: int) -> dict[int, str]:
    import socket
    import struct

    found: dict[int, str] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
        link.settimeout(5.0)
        for sequence, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            body = struct.pack(_DIAG_REQUEST, family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
            header = struct.pack(
                _NLMSG_HEADER,
                struct.calcsize(_NLMSG_HEADER) + len(body),
                _SOCK_DIAG_BY_FAMILY,
                _NLM_F_REQUEST_DUMP,
                sequence,
                0,
            )
            link.send(header + body)
            try:
                for message in _netlink_answers(link, sequence):
                    sport = int.from_bytes(message[4:6], "big")
                    if message[1] == _TCP_LISTEN and sport == port:
                        raw = message[8:12] if family == socket.AF_INET else message[8:24]
                        (inode,) = struct.unpack_from("=I", message, 68)
                        found[inode] = socket.inet_ntop(family, raw)
            except FileNotFoundError:
                if family == socket.AF_INET:
                    raise
                # ENOENT: a kernel without IPv6 has no IPv6 table (as it has no tcp6)
    return found


def _netlink_answers(link: socket.socket, sequence: int) -> Iterator[bytes]:
    """The ``inet_diag_msg`` bodies of a dump's answer, to its NLMSG_DONE; an NLMSG_ERROR
    raises the ``OSError`` of its errno."""
    import struct

    size = struct.calcsize(_NLMSG_HEADER)
    while True:
        data = link.recv(1 << 16)
        offset = 0
        while offset + size <= len(data):
            length, kind, _, seq, _ = struct.unpack_from(_NLMSG_HEADER, data, offset)
            if length < size:
                raise OSError(f"a netlink answer of {length} bytes")
            body = data[offset + size : offset + length]
            offset += (length + 3) & ~3  # NLMSG_ALIGN
            if seq != sequence:
                continue
            if kind == _NLMSG_DONE:
                return
            if kind == _NLMSG_ERROR:
                (error,) = struct.unpack_from("=i", body)
                if error:
                    raise OSError(-error, os.strerror(-error))
                continue
            if len(body) >= _DIAG_MESSAGE_BYTES:
                yield body


def _listening_in_proc(port: int) -> dict[int, str]:
    found: dict[int, str] = {}
    tables = 0
    for table in _TCP_TABLES:
        try:
            with open(table, encoding="ascii") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:  # a kernel without IPv6 has no tcp6
            continue
        tables += 1
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port:
                found[int(fields[9])] = _address(address)
    if not tables:
        raise OSError(f"cannot read {' or '.join(_TCP_TABLES)}")
    return found


def _address(hex_address: str) -> str:
    """``0100007F`` -> ``127.0.0.1``: the kernel prints each 32-bit word in host byte order."""
    import socket
    import sys

    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets ``pid`` has open (its ``socket:[N]`` descriptors); empty when
    it is gone or not ours to read."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return set()
    found = set()
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith(_SOCKET_LINK):
            found.add(int(target[len(_SOCKET_LINK) : -1]))
    return found


def socket_holders(inodes: Collection[int]) -> dict[int, set[int]]:
    """pid -> which of ``inodes`` it holds, among the processes whose descriptors we may read
    (our own; every process as root)."""
    wanted, found = set(inodes), {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            held = socket_inodes(int(entry.name)) & wanted
            if held:
                found[int(entry.name)] = held
    return found


def session_members(sid: int, since_ticks: int = 0) -> list[int]:
    """Live processes of this user in session ``sid`` started at or after ``since_ticks``."""
    return [p.pid for p in iter_processes(os.getuid(), since_ticks) if p.sid == sid]
