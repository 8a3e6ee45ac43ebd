"""The keys of ``xpulaunch top``, as a pure state machine: a key and the view as it is give
the view as it becomes, and what the command must do (quit, cancel a job). The curses loop
only reads keys and draws; the tests drive this with strings."""

from __future__ import annotations

from dataclasses import dataclass, replace

SORTS = ("memory", "pid", "user")
ENTER = "\n"
ESCAPE = "\x1b"
BACKSPACE = "\x7f"

LEGEND = "q quit  s sort  f filter  Tab queue  c cancel a job  ? help"
HELP = (
    "KEYS",
    "  q        quit",
    "  s        sort the process rows: by GPU memory, pid, user (in turn)",
    "  f        filter the process rows: type mine, a user, or a job id, then Enter",
    "           (an empty filter shows everyone's)",
    "  Tab, Q   show or hide the queue",
    "  c        cancel one of your jobs: type its id, Enter, then y to confirm",
    "  Esc      leave a prompt",
    "  ?        this help (any key leaves it)",
)


@dataclass(frozen=True, slots=True)
class View:
    sort: str = SORTS[0]
    filter: str = ""  # "", "mine", "job 17", or a user name
    queue: bool = True
    help: bool = False
    prompt: str = ""  # "filter" or "cancel" while a value is typed
    typed: str = ""
    confirm: int | None = None  # the job a "y" would cancel
    message: str = ""  # the last thing a key did, shown in the legend line

    def legend(self) -> str:
        if self.prompt:
            asked = "filter (mine, a user, a job id)" if self.prompt == "filter" else "cancel job"
            return f"{asked}: {self.typed}_   (Enter: done, Esc: leave)"
        if self.confirm is not None:
            return f"cancel job {self.confirm}? y/n"
        # What the keys set comes first: at 80 columns the end of the line may be cut.
        shown = f"[sort: {self.sort}{f'  filter: {self.filter}' if self.filter else ''}]  "
        return (f"{self.message}  |  " if self.message else "") + shown + LEGEND


@dataclass(frozen=True, slots=True)
class Action:
    kind: str  # "quit" or "cancel"
    job_id: int | None = None


def on_key(view: View, key: str) -> tuple[View, Action | None]:
    """``view`` after ``key`` (one character; ``\\n`` for Enter, ``\\t`` for Tab)."""
    if view.prompt:
        return _typing(view, key)
    if view.confirm is not None:
        if key in ("y", "Y"):
            return replace(view, confirm=None), Action("cancel", view.confirm)
        return replace(view, confirm=None, message=f"job {view.confirm} not cancelled"), None
    if view.help:
        return replace(view, help=False), None
    view = replace(view, message="")
    if key == "q":
        return view, Action("quit")
    if key == "s":
        return replace(view, sort=SORTS[(SORTS.index(view.sort) + 1) % len(SORTS)]), None
    if key == "f":
        return replace(view, prompt="filter", typed=""), None
    if key == "c":
        return replace(view, prompt="cancel", typed=""), None
    if key in ("\t", "Q"):
        return replace(view, queue=not view.queue), None
    if key == "?":
        return replace(view, help=True), None
    return view, None


def _typing(view: View, key: str) -> tuple[View, Action | None]:
    if key == ESCAPE:
        return replace(view, prompt="", typed=""), None
    if key in (BACKSPACE, "\b"):
        return replace(view, typed=view.typed[:-1]), None
    if key not in (ENTER, "\r"):
        return (replace(view, typed=view.typed + key), None) if key.isprintable() else (view, None)
    typed = view.typed.strip()
    done = replace(view, prompt="", typed="")
    if view.prompt == "filter":
        return replace(done, filter=f"job {typed}" if typed.isdigit() else typed), None
    if not typed.isdigit():
        return replace(done, message=f"{typed or 'nothing'}: not a job id"), None
    return replace(done, confirm=int(typed)), None


def keeps(view: View, user: str | None, owner: str, me: str) -> bool:
    """Whether a process row of ``user`` for ``owner`` ("job 17") passes the filter."""
    if not view.filter:
        return True
    if view.filter == "mine":
        return user == me
    if view.filter.startswith("job "):
        return owner == view.filter
    return user == view.filter
