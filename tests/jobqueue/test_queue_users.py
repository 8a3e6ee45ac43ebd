"""Two users on one shared queue, through the filesystem as well as the CLI: neither can
change the other's records, and both see everyone's jobs."""

from __future__ import annotations

import json
import subprocess

import pytest

from queue_kit import NOBODY, QueueBox

pytestmark = pytest.mark.slow

# Finding 1 of the round-4 fault sweep, as user nobody: every queue database under the lock
# directory, rewritten with SQL; and the files themselves removed or replaced.
ATTACK = """
import json, os, pathlib, sqlite3, sys
root, held, running = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
said = {}
for path in sorted(root.rglob("queue.sqlite")):
    if path.stat().st_uid == os.getuid():
        continue  # our own records: ours to change
    try:
        db = sqlite3.connect(path)
        db.execute("DELETE FROM jobs WHERE id = ?", (held,))
        db.execute("UPDATE jobs SET state = 'done', exit_code = 0 WHERE id = ?", (running,))
        db.commit()
        said[str(path)] = "rewritten"
    except sqlite3.Error as exc:
        said[str(path)] = f"sqlite: {exc}"
    for name in (path.name, path.name + "-journal"):
        try:
            os.rename(path.with_name(name), path.with_name(name + ".gone"))
            said[name] = "moved"
        except OSError as exc:
            said[name] = exc.strerror
print(json.dumps(said))
"""


def as_nobody(box: QueueBox, script: str, *args: str) -> str:
    argv = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        box.python(NOBODY),
        "-c",
        script,
        *args,
    ]
    done = subprocess.run(
        argv, env=box.env(NOBODY), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_another_user_cannot_rewrite_or_remove_your_records(box: QueueBox) -> None:
    running = box.submit("--gpus", "1", "--grace", "1", "--", "sh", "-c", "sleep 60")
    held = box.submit("--hold", "--", "true")
    theirs = box.submit("--hold", "--", "true", uid=NOBODY)
    box.wait_states({running: "running"})
    said = json.loads(as_nobody(box, ATTACK, str(box.lock_dir), str(held), str(running)))
    assert said, "no queue database of root's was found"
    assert "rewritten" not in said.values() and "moved" not in said.values(), said
    assert set(said.values()) <= {
        "sqlite: attempt to write a readonly database",
        "Permission denied",
    }, said
    # Nothing changed, and each user sees both users' jobs.
    for uid in (0, NOBODY):
        jobs = [(j["id"], j["user"], j["state"]) for j in box.queue(uid)["jobs"]]
        assert jobs == [
            (running, "root", "running"),
            (held, "root", "held"),
            (theirs, "nobody", "held"),
        ]
    box.cli("cancel", "--lock-dir", box.lock_dir, str(running))
    assert box.wait_states({running: "cancelled"})[str(running)]["exit_code"] != 0


PLANT = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
# a row claiming root's job id and another claiming to be root's
db.execute("INSERT INTO jobs (id, uid, user, state, command, submitted_s) "
           "VALUES (?, 0, 'root', 'done', '[\\"rm\\"]', 0)", (int(sys.argv[2]),))
db.execute("UPDATE jobs SET uid = 0, user = 'root', priority = 1000 WHERE id = ?",
           (int(sys.argv[3]),))
db.commit()
"""


def test_rows_in_your_own_records_are_yours_whatever_they_say(box: QueueBox) -> None:
    """A user may write anything into their own store: a row there is still theirs (not
    root's, whatever its uid column says), and an id another user was given stays theirs."""
    mine = box.submit("--hold", "--", "true")
    theirs = box.submit("--hold", "--", "true", uid=NOBODY)
    as_nobody(box, PLANT, str(box.database(NOBODY)), str(mine), str(theirs))
    for uid in (0, NOBODY):
        jobs = [(j["id"], j["user"], j["state"]) for j in box.queue(uid)["jobs"]]
        assert jobs == [(mine, "root", "held"), (theirs, "nobody", "held")]
    refused = box.cli("release", "--lock-dir", box.lock_dir, str(theirs), check=False)
    assert refused.stderr == (
        f"xpulaunch: error: job {theirs} belongs to nobody: only nobody can release it\n"
    )


def test_another_users_broken_records_leave_only_their_jobs_out(box: QueueBox) -> None:
    """One user's corrupt store (theirs to break) does not stop everyone's `queue`: their
    jobs are left out, said in a warning, and the others are listed."""
    mine = box.submit("--hold", "--", "true")
    box.submit("--hold", "--", "true", uid=NOBODY)
    database = box.database(NOBODY)
    as_nobody(box, f"open({str(database)!r}, 'wb').write(b'not a database' * 400)")
    done = box.cli("queue", "--json", "--lock-dir", box.lock_dir)
    assert [j["id"] for j in json.loads(done.stdout)["jobs"]] == [mine]
    assert done.stderr.startswith(f"xpulaunch: warning: queue database {database} is not a usable")
