"""A dry run refuses exactly what a real run refuses, with the same one-line error."""

from __future__ import annotations

import pytest

from fault_cli import Launch, finish

BAD = [
    ("--max-restarts", "-5"),
    ("--backoff", "nan"),
    ("--backoff", "1:inf"),
    ("--grace", "inf"),
    ("--grace", "nan"),
    ("--stable-window", "-1"),
    ("--wait-timeout", "nan"),
    ("--wait-timeout", "inf"),
    ("--max-restarts", "2.5"),
    ("--metrics-interval", "0.001"),
    ("--nproc-per-node", "0"),
]


@pytest.mark.parametrize(("option", "value"), BAD)
def test_dry_and_real_runs_refuse_the_same_values(launch: Launch, option: str, value: str) -> None:
    results = []
    for dry in (["--dry-run"], []):
        code, _out, err = finish(launch("run", *dry, f"{option}={value}", "true"), timeout_s=60)
        results.append((code, err.strip()))
    (dry_code, dry_err), (real_code, real_err) = results
    assert dry_code == real_code == 2, (dry_err, real_err)
    assert dry_err == real_err
    assert dry_err.startswith("xpulaunch: error:") and option in dry_err
    assert len(dry_err.splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--gpus", "none", "--ranks", "7"], "--ranks 7: no such worker"),
        (["--gpus", "none", "--heartbeat"], "--heartbeat needs --hang-timeout"),
    ],
)
def test_dry_runs_refuse_what_real_runs_refuse_after_parsing(
    launch: Launch, args: list[str], words: str
) -> None:
    """Checks of combinations (not of one value) come after the parse: both runs make them."""
    errors = []
    for dry in (["--dry-run"], []):
        code, _out, err = finish(launch("run", *dry, *args, "true"), timeout_s=60)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
        errors.append(err)
    assert errors[0] == errors[1]
