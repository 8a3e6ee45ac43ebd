"""What the nodes of a static job say to each other: one line per message, ASCII.

Node 0 is the hub: every other node keeps one TCP connection to it for the job's life
(:mod:`xpulaunch.nodes.member`). A node introduces itself once, with the protocol's name and
version first, so that a node of another xpulaunch version or a program that is not an
xpulaunch node at all is refused in one line, whichever side it is on::

    xpulaunch-nodes/2 hello RANK NNODES NPROC [NOTE]   a node arrives (NOTE: why so few workers)
    here                                              node 0 admitted it; wait for go
    refused: WHY                                      node 0 did not; it closes the connection
    go N0,N1,...                                      start: every node's worker count, by rank
    ready                                             this node's old workers are gone; meet
    fail NODE WHY                                     NODE's workers failed, or it was stopped
    bye NODE STATUS                                   NODE's supervisor ended with STATUS

Pure: parsing and formatting only; the sockets are the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

PROTOCOL = "xpulaunch-nodes/2"
# The longest line a node reads: a go line names every node's count (a few thousand nodes).
MAX_LINE_BYTES = 65536
_MAX_NOTE_CHARS = 160


class Verb(str, Enum):
    HERE = "here"
    REFUSED = "refused:"
    GO = "go"
    READY = "ready"
    FAIL = "fail"
    BYE = "bye"


@dataclass(frozen=True, slots=True)
class Hello:
    """A node's introduction. ``note``: a few words on its workers (``nvidia 3 busy``)."""

    node_rank: int
    nnodes: int
    nproc: int
    note: str = ""

    def line(self) -> str:
        note = f" {clean(self.note)}" if self.note else ""
        return f"{PROTOCOL} hello {self.node_rank} {self.nnodes} {self.nproc}{note}\n"


@dataclass(frozen=True, slots=True)
class Message:
    """One message after the hello. ``node``: whose failure or end (``fail``, ``bye``);
    ``counts``: every node's worker count (``go``); ``status``: ``bye``'s exit status."""

    verb: Verb
    text: str = ""
    node: int = 0
    counts: tuple[int, ...] = ()
    status: int = 0

    def line(self) -> str:
        if self.verb is Verb.GO:
            return f"go {','.join(str(n) for n in self.counts)}\n"
        if self.verb is Verb.FAIL:
            return f"fail {self.node} {clean(self.text)}\n"
        if self.verb is Verb.BYE:
            return f"bye {self.node} {self.status}\n"
        if self.verb is Verb.REFUSED:
            return f"refused: {clean(self.text)}\n"
        return f"{self.verb.value}\n"


def clean(text: str) -> str:
    """``text`` as one short line of printable ASCII (a note or a reason may come from a
    worker's error)."""
    flat = "".join(c if " " <= c <= "~" else " " for c in text)
    flat = " ".join(flat.split())
    return flat if len(flat) <= _MAX_NOTE_CHARS else flat[: _MAX_NOTE_CHARS - 3] + "..."


def read_hello(line: str, nnodes: int) -> Hello | str:
    """The hello in ``line``, or why node 0 refuses it (one phrase for a ``refused:`` line)."""
    words = line.split(" ", 5)
    if not words or not words[0].startswith("xpulaunch-"):
        return f"not an xpulaunch node (it said {shown(line)})"
    if words[0] != PROTOCOL:
        return (
            f"an xpulaunch node of another version ({shown(words[0])}; node 0 speaks "
            f"{PROTOCOL}); run the same xpulaunch version on every node"
        )
    numbers = words[2:5]
    if len(words) < 5 or words[1] != "hello" or not all(_count(w) for w in numbers):
        return f"a garbled hello ({shown(line)})"
    rank, their_nnodes, nproc = (int(w) for w in numbers)
    if their_nnodes != nnodes:
        return f"node 0 runs --nnodes {nnodes}, this node --nnodes {their_nnodes}"
    if not 0 < rank < nnodes:
        return f"--node-rank {rank} is out of range 1-{nnodes - 1} for --nnodes {nnodes}"
    if nproc < 1:
        return f"a garbled hello ({shown(line)})"
    return Hello(rank, nnodes, nproc, clean(words[5]) if len(words) > 5 else "")


def read_message(line: str, nnodes: int) -> Message | None:
    """The message in ``line``; None when it is not one of :class:`Verb`'s (garbled)."""
    if line.startswith("refused:"):
        return Message(Verb.REFUSED, clean(line[len("refused:") :]))
    verb, _, rest = line.partition(" ")
    if verb in (Verb.HERE.value, Verb.READY.value) and not rest:
        return Message(Verb(verb))
    if verb == Verb.GO.value:
        counts = rest.split(",")
        if len(counts) != nnodes or not all(_count(c) and int(c) > 0 for c in counts):
            return None
        return Message(Verb.GO, counts=tuple(int(c) for c in counts))
    node_text, _, tail = rest.partition(" ")
    if not _count(node_text) or int(node_text) >= nnodes:
        return None
    if verb == Verb.FAIL.value:
        return Message(Verb.FAIL, clean(tail), node=int(node_text))
    if verb == Verb.BYE.value and _count(tail):
        return Message(Verb.BYE, node=int(node_text), status=int(tail))
    return None


def shown(text: str) -> str:
    """A few characters of what a stranger said, quoted and made printable."""
    short = clean(text)
    return repr(short if len(short) <= 40 else short[:37] + "...")


def _count(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 9


def counts_text(counts: tuple[int, ...]) -> str:
    """``3 workers in all (node 0: 2, node 1: 1)``; just the total when every node has the
    same count."""
    total = sum(counts)
    plural = "" if total == 1 else "s"
    if len(set(counts)) <= 1:
        return f"{total} worker{plural} in all"
    each = ", ".join(f"node {rank}: {n}" for rank, n in enumerate(counts))
    return f"{total} worker{plural} in all ({each})"
