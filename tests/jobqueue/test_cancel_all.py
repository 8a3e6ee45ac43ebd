"""``cancel --all`` that finds nothing to cancel says so (it used to print nothing)."""

from __future__ import annotations

from queue_kit import NOBODY, QueueBox


def test_cancel_all_with_no_queue_and_with_nothing_of_mine(box: QueueBox) -> None:
    said = f"no job of yours to cancel in {box.lock_dir}\n"
    done = box.cli("cancel", "--lock-dir", box.lock_dir, "--all")
    assert (done.returncode, done.stdout, done.stderr) == (0, said, "")
    box.submit("--hold", "--", "true")
    box.cli("cancel", "--lock-dir", box.lock_dir, "1")  # ended: not mine to cancel any more
    box.submit("--hold", "--", "true", uid=NOBODY)  # someone else's
    done = box.cli("cancel", "--lock-dir", box.lock_dir, "--all")
    assert (done.returncode, done.stdout, done.stderr) == (0, said, "")
    states = {j["id"]: j["state"] for j in box.queue()["jobs"]}
    assert states[2] == "held"
