"""The run's probe forked by the entry point, before the command line is parsed: which command
lines start it, the run takes it, and every way out ends it (no process left behind); the
collector paused while the run imports its modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_probe_isolated import fake_intel_host, run_isolated

from xpulaunch.cli.entry import NOT_A_RUN, probe_wanted
from xpulaunch.cli.group import COMMANDS
from xpulaunch.core.inventory import dumps
from xpulaunch.probing.host import probe_from_env


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["train.py", "--gpus", "auto"], True),
        (["--gpus", "none", "--", "python", "-c", "pass"], True),
        (["run", "train.py"], True),
        (["torchrun", "--nproc-per-node", "2", "train.py"], True),
        (["-p", "big", "train.py"], True),
        (["--profile=big", "run", "train.py"], True),
        (["train.py", "--", "--help"], True),  # the program's --help, after --
        (["devices"], False),
        (["-p", "big", "devices"], False),
        (["llama", "-m", "model.gguf"], False),
        (["status"], False),
        (["logs", "dir"], False),
        (["config"], False),
        (["train.py", "--dry-run"], False),  # a dry run probes in-process, as before
        (["--help"], False),
        (["run", "-h"], False),
        (["--version"], False),
        (["--inventory", "inv.json", "train.py"], False),  # nothing to probe
        (["--inventory=inv.json", "train.py"], False),
        ([], False),
        (["-p", "big"], False),
    ],
)
def test_which_command_lines_start_the_probe_early(args: list[str], wanted: bool) -> None:
    assert probe_wanted(args, {}) is wanted


def test_prestart_off_starts_no_probe_early() -> None:
    assert probe_wanted(["train.py"], {"XPULAUNCH_PRESTART": "0"}) is False
    assert probe_wanted(["train.py"], {"XPULAUNCH_PRESTART": "1"}) is True


def test_the_commands_that_run_nothing_are_the_groups_others() -> None:
    assert set(COMMANDS) - {"run", "torchrun"} == NOT_A_RUN


def test_the_run_takes_the_early_probe_of_its_environment(tmp_path: Path) -> None:
    env = fake_intel_host(tmp_path)
    code = textwrap.dedent("""
        import json, os
        from xpulaunch.cli import entry
        from xpulaunch.core.inventory import dumps
        from xpulaunch.probing.isolated import ForkedProbe
        early = ForkedProbe(dict(os.environ))
        entry._early.append(early)
        probe = entry.forked_probe(dict(os.environ))
        doc = dumps(probe.result())
        print(json.dumps({"same": probe is early, "doc": doc, "left": len(entry._early)}))
    """)
    result = run_isolated(code, env)
    assert result["same"] is True and result["left"] == 0
    assert result["doc"] == dumps(probe_from_env({**os.environ, **env}))


def test_an_early_probe_of_another_environment_is_ended_and_replaced(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import json, os
        from xpulaunch.cli import entry
        from xpulaunch.probing.isolated import ForkedProbe
        early = ForkedProbe({**os.environ, "ONE": "1"})
        entry._early.append(early)
        pid = early._pid
        probe = entry.forked_probe(dict(os.environ))
        try:
            os.waitpid(pid, os.WNOHANG)
            reaped = False
        except ChildProcessError:
            reaped = True
        probe.result()
        print(json.dumps({"same": probe is early, "reaped": reaped}))
    """)
    result = run_isolated(code, fake_intel_host(tmp_path))
    assert result == {"same": False, "reaped": True}


# Runs the entry point with a probe that takes a minute, and says when the probe started,
# which probe the run took and how the collector was then: the probe must start before click is
# imported, and be ended (killed and reaped) when the command line fails; the collector is
# paused until the run has imported the supervisor, then resumed with what was imported frozen.
_ENTRY_DRIVER = """
import gc, json, os, sys, time
from xpulaunch.cli import entry
from xpulaunch.probing import isolated

def slow_probe(env):
    if os.environ.get("SLOW_PROBE"):
        time.sleep(60)
    return real_probe(env)

real_probe, isolated._probe = isolated._probe, slow_probe
real_fork, real_take = isolated.ForkedProbe.__init__, entry.forked_probe

def fork(self, env):
    real_fork(self, env)
    if not entry._early:  # the entry point's
        print(json.dumps({"started": self._pid, "click": "click" in sys.modules}), flush=True)

def forked_probe(env):
    early = list(entry._early)
    probe = real_take(env)
    print(json.dumps({"taken": bool(early) and probe is early[0], "gc": gc.isenabled()}),
          flush=True)
    return probe

def resume_collector():
    real_resume()
    print(json.dumps({"gc": gc.isenabled(), "frozen": gc.get_freeze_count() > 1000}), flush=True)

isolated.ForkedProbe.__init__, entry.forked_probe = fork, forked_probe
real_resume, entry.resume_collector = entry.resume_collector, resume_collector
sys.argv = ["xpulaunch", *sys.argv[1:]]
entry.console_main()
"""


def run_entry(args: list[str], env: dict[str, str]) -> tuple[int, list[dict[str, object]], str]:
    done = subprocess.run(
        [sys.executable, "-c", _ENTRY_DRIVER, *args], capture_output=True, text=True,
        timeout=50, check=False, env={**os.environ, **env},
    )  # fmt: skip
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, lines, done.stderr


def test_a_run_starts_its_probe_before_click_and_takes_it_and_pauses_the_collector(
    tmp_path: Path,
) -> None:
    out = tmp_path / "ran"
    code, lines, err = run_entry(
        ["--gpus", "none", "--", sys.executable, "-c", f"open({str(out)!r}, 'w').close()"],
        fake_intel_host(tmp_path),
    )
    assert code == 0, err
    assert lines[0]["click"] is False
    assert lines[1] == {"taken": True, "gc": False}
    assert lines[2] == {"gc": True, "frozen": True}
    assert out.exists()


def test_a_bad_command_line_ends_the_early_probe(tmp_path: Path) -> None:
    code, lines, err = run_entry(
        ["--gpus", "none", "--no-such-option", "train.py"], {"SLOW_PROBE": "1"}
    )
    assert code == 2 and "no such option" in err.lower(), err
    pid = lines[0]["started"]
    assert isinstance(pid, int)
    assert not Path(f"/proc/{pid}").exists()  # killed, and reaped by the command line


def test_resume_leaves_a_collector_that_the_application_turned_off() -> None:
    code = textwrap.dedent("""
        import gc, json
        from xpulaunch.cli import entry
        gc.disable()  # an application's choice, not the entry point's
        entry.resume_collector()
        print(json.dumps({"gc": gc.isenabled(), "frozen": gc.get_freeze_count()}))
    """)
    assert run_isolated(code, {}) == {"gc": False, "frozen": 0}
