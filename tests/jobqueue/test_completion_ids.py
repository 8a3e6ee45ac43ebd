"""Shell completion of job ids from the queue: ``cancel`` offers your jobs that have not
ended, ``hold`` your queued ones, ``release`` your held ones, ``logs`` every job."""

from __future__ import annotations

from queue_kit import NOBODY, QueueBox


def ids(box: QueueBox, line: str) -> list[str]:
    words = line.split(" ")
    env = {"COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)}
    done = box.cli(_XPULAUNCH_COMPLETE="bash_complete", **env)
    return [item.split(",", 1)[1] for item in done.stdout.splitlines() if item]


def test_job_ids_by_command(box: QueueBox) -> None:
    held = box.submit("--hold", "--", "true")
    queued = box.submit("--after", str(held), "--", "true")  # waits for the held one
    ended = box.submit("--hold", "--", "true")
    box.cli("cancel", "--lock-dir", box.lock_dir, str(ended))
    theirs = box.submit("--hold", "--", "true", uid=NOBODY)
    at = f"--lock-dir {box.lock_dir}"
    assert ids(box, f"xpulaunch cancel {at} ") == [str(held), str(queued)]
    assert ids(box, f"xpulaunch cancel {at} {held} ") == [str(queued)]  # not twice
    assert ids(box, f"xpulaunch hold {at} ") == [str(queued)]
    assert ids(box, f"xpulaunch release {at} ") == [str(held)]
    assert ids(box, f"xpulaunch logs {at} ") == [str(j) for j in (held, queued, ended, theirs)]
    assert ids(box, f"xpulaunch wait {at} ") == [
        str(j) for j in (held, queued, theirs)
    ]  # not ended
    assert ids(box, f"xpulaunch logs {at} {box.root}/") == [f"{box.root}/"]  # a folder then
