"""Config merge and provenance: table tests of the pure core."""

from __future__ import annotations

import pytest

from xpulaunch.cli.config_schema import Explained, Layer, OptionInfo, Setting, explain, merge
from xpulaunch.errors import UsageError

VALID = {"gpus", "nproc-per-node", "max-restarts", "isolate", "grace"}
USER = Layer("user.toml", {"gpus": "auto", "grace": 5.0, "profiles": {"big": {"gpus": "4"}}})
PROJECT = Layer(
    "xpulaunch.toml",
    {"nproc_per_node": 2, "gpus": "2", "profiles": {"big": {"nproc-per-node": 8}}},
)


@pytest.mark.parametrize(
    ("layers", "profile", "expected"),
    [
        ([], None, {}),
        ([USER], None, {"gpus": ("auto", "user.toml"), "grace": (5.0, "user.toml")}),
        (
            [USER, PROJECT],
            None,
            {
                "gpus": ("2", "xpulaunch.toml"),
                "grace": (5.0, "user.toml"),
                "nproc-per-node": (2, "xpulaunch.toml"),
            },
        ),
        (
            [USER, PROJECT],
            "big",
            {
                # the project's top level wins over the user's profile: project > user
                "gpus": ("2", "xpulaunch.toml"),
                "grace": (5.0, "user.toml"),
                "nproc-per-node": (8, "xpulaunch.toml [profiles.big]"),
            },
        ),
        ([USER], "big", {"gpus": ("4", "user.toml [profiles.big]"), "grace": (5.0, "user.toml")}),
    ],
)
def test_later_layers_and_profiles_win(
    layers: list[Layer], profile: str | None, expected: dict[str, tuple[object, str]]
) -> None:
    merged = merge(layers, VALID, profile)
    assert {k: (s.value, s.source) for k, s in merged.items()} == expected


@pytest.mark.parametrize(
    ("table", "profile", "message"),
    [
        ({"gpu": "2"}, None, "f.toml: unknown key 'gpu'; did you mean 'gpus'?"),
        ({"zzz": 1}, None, "f.toml: unknown key 'zzz'"),
        ({"gpus": [1, 2]}, None, "f.toml: gpus: expected a string, number or true/false, not list"),
        ({"gpus": "1", "GPUS": "2"}, None, "f.toml: GPUS: set twice"),
        (
            {"profiles": {"big": {"grace": 1}}},
            "bog",
            "--profile bog: no such profile; did you mean",
        ),
        ({"profiles": "big"}, None, "f.toml: profiles: expected tables such as [profiles.big]"),
        ({"profiles": {"big": {"isolat": True}}}, "big", "f.toml [profiles.big]: unknown key"),
    ],
)
def test_bad_files_name_the_file_and_key(
    table: dict[str, object], profile: str | None, message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        merge([Layer("f.toml", table)], VALID, profile)
    assert str(caught.value).startswith(message)


def test_an_empty_profile_is_a_profile() -> None:
    layer = Layer("f.toml", {"grace": 1, "profiles": {"empty": {}}})
    assert merge([layer], VALID, "empty") == {"grace": Setting(1, "f.toml")}


def test_a_profile_without_files_says_so() -> None:
    with pytest.raises(UsageError, match="--profile big: no config file found"):
        merge([], VALID, "big")


OPTIONS = [
    OptionInfo("gpus", (), "auto"),
    OptionInfo("grace", ("XPULAUNCH_GRACE",), 10.0),
    OptionInfo("max-restarts", ("XPULAUNCH_MAX_RESTARTS",), None),
    OptionInfo("isolate", (), False),
]


@pytest.mark.parametrize(
    ("settings", "env", "expected"),
    [
        (
            {},
            {},
            [("gpus", "auto", "default"), ("grace", 10.0, "default"),
             ("max-restarts", None, "default"), ("isolate", False, "default")],
        ),
        (
            {"gpus": Setting("2", "p.toml"), "grace": Setting(3.0, "u.toml")},
            {"XPULAUNCH_GRACE": "7"},
            [("gpus", "2", "p.toml"), ("grace", "7", "env XPULAUNCH_GRACE"),
             ("max-restarts", None, "default"), ("isolate", False, "default")],
        ),
        (
            {"isolate": Setting(True, "p.toml [profiles.x]")},
            {"XPULAUNCH_MAX_RESTARTS": "-1"},
            [("gpus", "auto", "default"), ("grace", 10.0, "default"),
             ("max-restarts", "-1", "env XPULAUNCH_MAX_RESTARTS"),
             ("isolate", True, "p.toml [profiles.x]")],
        ),
    ],
)  # fmt: skip
def test_explain_env_over_files_over_defaults(
    settings: dict[str, Setting], env: dict[str, str], expected: list[tuple[object, ...]]
) -> None:
    assert explain(OPTIONS, settings, env) == [Explained(*row) for row in expected]  # type: ignore[arg-type]
