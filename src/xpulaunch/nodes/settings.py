"""``--nnodes``, ``--node-rank``, ``--master-addr``/``--master-port``, ``--rdzv-*``: where
this node stands in the job and where node 0 listens, with torchrun's meanings; and
``--rdzv-conf``, checked as torch's c10d rendezvous would read it (the agent's plan itself is
:mod:`xpulaunch.nodes.elastic`'s, loaded only for c10d).

Precedence: the command line, then ``MASTER_ADDR``/``MASTER_PORT`` and the cluster's
variables (``--nnodes auto``, :mod:`xpulaunch.nodes.cluster`), then torchrun's defaults.
Pure: the environment is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpulaunch.errors import UsageError
from xpulaunch.model import NodeGroup

if TYPE_CHECKING:
    from xpulaunch.nodes.cluster import ClusterJob, Expander

LOOPBACK = "127.0.0.1"
# NodeGroup.source of --nnodes auto where no cluster environment was found.
NO_CLUSTER = "none"
# torchrun's default; every node must agree on it, so several nodes never guess a free port.
DEFAULT_PORT = 29500

# The settings torch's c10d rendezvous reads from --rdzv-conf (dynamic_rendezvous.py:
# create_handler, c10d_rendezvous_backend.py: create_backend), by what each value must be.
# torch reads them with int() (RendezvousParameters.get_as_int): whole seconds only.
_SECONDS = (
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "keep_alive_interval",
    "read_timeout",
)
_COUNTS = ("keep_alive_max_attempt",)
_BOOLEANS = ("is_host",)  # RendezvousParameters.get_as_bool's spellings
_TRUE, _FALSE = ("1", "true", "t", "yes", "y"), ("0", "false", "f", "no", "n")
RDZV_CONF_KEYS = (*_SECONDS, *_COUNTS, *_BOOLEANS)


@dataclass(frozen=True, slots=True)
class NodeRequest:
    """The multi-node options as typed; None where not given."""

    nnodes: str | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None


@dataclass(frozen=True, slots=True)
class ElasticSpec:
    """A job on torch's c10d rendezvous: ``min_nodes`` to ``max_nodes`` nodes meet at
    ``endpoint`` under ``run_id``; torch assigns node ranks at every round."""

    min_nodes: int
    max_nodes: int
    endpoint: str
    run_id: str


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """The resolved answer; ``master_port`` None: one node, any free port will do.
    ``elastic``: set for ``--rdzv-backend c10d`` (then the plan is this node's alone)."""

    nodes: NodeGroup
    master_addr: str
    master_port: int | None
    elastic: ElasticSpec | None = None


def resolve_nodes(
    request: NodeRequest, env: Mapping[str, str], expand: Expander | None = None
) -> NodeSettings:
    """Raises :class:`UsageError` with one line naming the option at fault. ``expand``:
    how a Slurm host list becomes hosts."""
    backend = (request.rdzv_backend or "static").lower()
    if backend == "c10d":
        return NodeSettings(NodeGroup(), LOOPBACK, None, elastic=elastic_spec(request))
    if backend != "static":
        raise UsageError(
            f"--rdzv-backend {request.rdzv_backend}: expected static (MASTER_ADDR/MASTER_PORT) "
            "or c10d (torch's elastic rendezvous)"
        )
    addr, port = _endpoint(request)
    if addr is not None:
        _master_addr(addr)
    if (request.nnodes or "").strip().lower() == "auto":
        if request.node_rank is not None:
            raise UsageError("--node-rank: with --nnodes auto the node rank comes from the cluster")
        from xpulaunch.nodes.cluster import find_cluster  # only --nnodes auto reads a cluster
        from xpulaunch.nodes.hostlist import expand_hostlist

        return _from_cluster(addr, port, find_cluster(env, expand or expand_hostlist))
    nnodes = parse_nnodes(request.nnodes)
    node_rank = 0 if request.node_rank is None else request.node_rank
    if not 0 <= node_rank < nnodes:
        raise UsageError(
            f"--node-rank {node_rank}: expected 0 to {nnodes - 1} for --nnodes {nnodes}"
        )
    if nnodes == 1:  # one node: a free port, as before; a stray MASTER_* in the env is not ours
        return NodeSettings(NodeGroup(), addr or LOOPBACK, port)
    return NodeSettings(
        NodeGroup(nnodes=nnodes, node_rank=node_rank),
        addr or _master_addr(env.get("MASTER_ADDR") or LOOPBACK),  # addr: checked above
        port or _env_port(env) or DEFAULT_PORT,
    )


def host_problem(host: str) -> str | None:
    """Why ``host`` is no name or address the system could look up; None when it could be.

    Python's socket module hands a name to the resolver in its IDNA form, and raises
    UnicodeError or TypeError (not socket.gaierror, which callers expect) for a name that has
    none: a part between dots longer than 63 characters, bytes that are not UTF-8 text (argv
    decoded with surrogateescape), a NUL."""
    if "\0" in host:
        return "it contains a NUL character"
    if any("\ud800" <= c <= "\udfff" for c in host):
        return "it has bytes that are not UTF-8 text"
    try:
        host.encode("idna")
    except UnicodeError:
        return "a part between dots is empty, longer than 63 characters, or not a name"
    return None


def _master_addr(addr: str) -> str:
    """Node 0's address from wherever it came (MASTER_ADDR, the cluster, an accelerate
    config): one that no socket call could take is refused here, in one line."""
    why = host_problem(addr)
    if why is not None:
        raise UsageError(
            f"node 0's address {addr!r} is not a host name or address ({why}); check "
            "--master-addr, MASTER_ADDR or the accelerate config's main_process_ip"
        )
    return addr


def elastic_spec(request: NodeRequest) -> ElasticSpec:
    """``--rdzv-backend c10d``: needs ``--rdzv-endpoint``; ``--nnodes`` N or MIN:MAX."""
    given = [
        name
        for name, value in (
            ("--node-rank", request.node_rank),
            ("--master-addr", request.master_addr),
            ("--master-port", request.master_port),
        )
        if value is not None
    ]
    if given:
        raise UsageError(
            f"{given[0]}: with --rdzv-backend c10d, torch's rendezvous assigns node ranks and "
            "the workers' master; give --rdzv-endpoint HOST:PORT"
        )
    if request.rdzv_endpoint is None:
        raise UsageError(
            "--rdzv-backend c10d: give --rdzv-endpoint HOST:PORT (the same on every node)"
        )
    _host, _port = _split_endpoint(request.rdzv_endpoint)
    low, high = _node_range(request.nnodes or "1")
    return ElasticSpec(low, high, request.rdzv_endpoint, request.rdzv_id or "none")


def _node_range(text: str) -> tuple[int, int]:
    low, _, high = text.strip().partition(":")
    try:
        first, last = int(low), int(high or low)
    except ValueError:
        raise UsageError(f"--nnodes {text!r}: expected N, MIN:MAX or auto") from None
    if first < 1 or last < first:
        raise UsageError(f"--nnodes {text!r}: expected N >= 1, or MIN:MAX with 1 <= MIN <= MAX")
    return first, last


def parse_nnodes(text: str | None) -> int:
    """``N`` or ``N:N`` (torchrun's MIN:MAX with MIN == MAX is a fixed size)."""
    if text is None:
        return 1
    first, last = _node_range(text)
    if first != last:
        raise UsageError(
            f"--nnodes {text}: an elastic size needs --rdzv-backend c10d --rdzv-endpoint "
            "HOST:PORT; the static rendezvous has a fixed --nnodes N"
        )
    return first


def _from_cluster(addr: str | None, port: int | None, job: ClusterJob | None) -> NodeSettings:
    if job is None:  # a workstation: the same command line runs the job on this one node
        return NodeSettings(NodeGroup(source=NO_CLUSTER), addr or LOOPBACK, port)
    master_addr = addr or (job.master_addr and _master_addr(job.master_addr))
    if not master_addr:
        if job.nnodes > 1:
            raise UsageError(
                f"--nnodes auto: {job.source} names no node 0 address; give --master-addr "
                "HOST (the same on every node) or set MASTER_ADDR"
            )
        master_addr = LOOPBACK
    nodes = NodeGroup(job.nnodes, job.node_rank, source=job.source, hosts=job.hosts)
    return NodeSettings(nodes, master_addr, port or job.master_port or DEFAULT_PORT)


def _endpoint(request: NodeRequest) -> tuple[str | None, int | None]:
    """``--master-addr``/``--master-port``, or torchrun's static ``--rdzv-endpoint``."""
    if request.rdzv_endpoint is None:
        return request.master_addr, request.master_port
    if request.master_addr is not None or request.master_port is not None:
        raise UsageError("--rdzv-endpoint: give it or --master-addr/--master-port, not both")
    return _split_endpoint(request.rdzv_endpoint)


def _split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port_text = endpoint.rpartition(":")
    if not sep or not host or not _is_port(port_text):
        raise UsageError(f"--rdzv-endpoint {endpoint!r}: expected HOST:PORT")
    why = host_problem(host)
    if why is not None:
        raise UsageError(f"--rdzv-endpoint {endpoint!r}: not a host name or address ({why})")
    return host.strip("[]"), int(port_text)


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and 1 <= int(text) <= 65535


def _env_port(env: Mapping[str, str]) -> int | None:
    text = env.get("MASTER_PORT", "")
    if not text:
        return None
    if not _is_port(text):
        raise UsageError(f"MASTER_PORT={text!r}: expected a port 1-65535")
    return int(text)


def parse_rdzv_conf(
    text: str, said: Callable[[str], str] = lambda pair: f"--rdzv-conf {pair}"
) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE[,KEY=VALUE]`` of :data:`RDZV_CONF_KEYS` -> (key, value) pairs in the form
    torch reads (a later key wins, as in torch). A key torch's c10d rendezvous does not read
    or a value it would refuse is a one-line UsageError; ``said`` names a pair in it (the
    option, or torchrun's ``PET_RDZV_CONF``)."""
    settings: dict[str, str] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        key, _, value = (part.strip() for part in pair.partition("="))
        if key not in RDZV_CONF_KEYS:
            raise UsageError(
                f"{said(pair)}: unknown key {key!r}; torch's c10d rendezvous reads "
                f"{', '.join(sorted(RDZV_CONF_KEYS))}"
            )
        settings[key] = _conf_value(key, value, said(pair))
    return tuple(settings.items())


def _conf_value(key: str, value: str, said: str) -> str:
    if key in _BOOLEANS:
        if value.lower() not in (*_TRUE, *_FALSE):
            raise UsageError(f"{said}: expected 1 or 0 (true or false)")
        return value.lower()
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (number.is_integer() and number >= 1):  # torch refuses 0 and reads int(value)
        what = "a count" if key in _COUNTS else "whole seconds"
        raise UsageError(f"{said}: expected {what} of at least 1 (torch reads an integer)")
    return str(int(number))
