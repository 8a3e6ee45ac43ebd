"""``models.toml`` of ``xpulaunch llama serve`` (pure) and the router's decisions: ttl,
eviction order, which models to evict, round robin (pure, clock as a number)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xpulaunch.errors import UsageError
from xpulaunch.llamacpp.router.config import parse_config, read_config
from xpulaunch.llamacpp.router.policy import (
    ModelState,
    ModelView,
    Outcome,
    choose_evictions,
    eviction_order,
    expired,
    next_expiry,
    next_replica,
)

READY = ModelState.READY


def test_a_full_table_and_the_defaults() -> None:
    config = parse_config({"models": {
        "qwen-7b": {"model": "qwen.gguf", "gpus": "2", "replicas": 2, "ttl": 600,
                    "pinned": True, "aliases": ["qwen"], "args": ["-c", "8192"]},
        "small": {"model": "/m/small.gguf"},
    }}, source="models.toml", base_dir="/srv")  # fmt: skip
    qwen = config.by_id("qwen-7b")
    assert qwen.model == "/srv/qwen.gguf"  # relative to the file's folder
    assert (qwen.gpus, qwen.replicas, qwen.ttl_s, qwen.pinned) == ("2", 2, 600.0, True)
    assert qwen.args == ("-c", "8192")
    small = config.by_id("small")
    assert (small.gpus, small.replicas, small.ttl_s, small.pinned) == ("auto", 1, 0.0, False)
    assert config.resolve("qwen") is qwen and config.resolve("small") is small
    assert config.resolve("nope") is None


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "models.toml: no [models.ID] table"),
        ({"model": {}}, "unknown top-level key 'model'"),
        ({"models": {"a": "x.gguf"}}, "[models.a]: expected a table of model, gpus"),
        ({"models": {"a": {}}}, '[models.a]: no model; add model = "/path/to/model.gguf"'),
        (
            {"models": {"a": {"model": "m", "gpu": 1}}},
            "[models.a]: unknown key 'gpu'; did you mean 'gpus'? expected model, gpus",
        ),
        ({"models": {"a": {"model": "m", "zzz": 1}}}, "unknown key 'zzz'; expected model, gpus"),
        ({"models": {"a": {"model": "m", "replicas": 0}}}, "replicas: expected a whole number"),
        ({"models": {"a": {"model": "m", "replicas": "2"}}}, "replicas: expected a whole number"),
        ({"models": {"a": {"model": "m", "ttl": -1}}}, "ttl: expected seconds >= 0"),
        ({"models": {"a": {"model": "m", "ttl": True}}}, "ttl: expected seconds >= 0"),
        ({"models": {"a": {"model": "m", "pinned": "yes"}}}, "pinned: expected true or false"),
        ({"models": {"a": {"model": "m", "gpus": "lots"}}}, "gpus 'lots': expected auto"),
        ({"models": {"a": {"model": "m", "args": "-c 8"}}}, "args: expected a list of strings"),
        ({"models": {"a": {"model": "m", "args": ["--port", "9"]}}}, "--port is set by the router"),
        ({"models": {"a": {"model": "m", "args": ["-m", "x"]}}}, "--model is set by the model key"),
        (
            {"models": {"a": {"model": "m", "aliases": ["b"]}, "b": {"model": "n"}}},
            "'b' names both [models.a] and [models.b]",
        ),
        ({"models": {"a b": {"model": "m"}}}, "a model id must be non-empty printable text"),
        # The id names a folder under --log-dir: none may lead out of it or hide in it.
        ({"models": {"../../escaped": {"model": "m"}}}, "[models.../../escaped]: a model id"),
        ({"models": {"/abs/path": {"model": "m"}}}, "must not start or end with '/'"),
        ({"models": {"org/": {"model": "m"}}}, "must not start or end with '/'"),
        ({"models": {"org//m": {"model": "m"}}}, "hold '//'"),
        ({"models": {"org/../m": {"model": "m"}}}, "a part starting with '.'"),
        ({"models": {".hidden": {"model": "m"}}}, "a part starting with '.'"),
        ({"models": {"..": {"model": "m"}}}, "('..' would lead out of --log-dir)"),
        # TOML's \u0000: os.stat() raised ValueError on the path (a traceback), and a server
        # started with such an argument would die in Popen.
        ({"models": {"a": {"model": "a\0b"}}}, "model: expected the path of a .gguf file"),
        ({"models": {"a": {"model": "m", "args": ["-c", "8\0"]}}}, "holds a NUL character"),
    ],
)
def test_every_mistake_is_one_line_naming_table_and_key(document: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(UsageError) as raised:
        parse_config(document, source="models.toml")
    assert message in raised.value.message, raised.value.message
    assert "\n" not in raised.value.message


def test_ids_with_slashes_and_dots_inside_are_kept() -> None:
    """Hugging Face's ``org/name`` and versions such as ``qwen2.5``: one folder each, nested
    inside --log-dir."""
    ids = ("org/qwen2.5-7b", "a.b", "x/y/z", "m..n")
    config = parse_config({"models": {i: {"model": "m.gguf"} for i in ids}})
    assert config.ids == ids


def test_a_router_config_made_in_python_is_checked_too(tmp_path: Path) -> None:
    from helpers import load_inventory
    from xpulaunch.llamacpp.router.config import ModelConfig, RouterConfig
    from xpulaunch.llamacpp.router.serve import make_router

    config = RouterConfig((ModelConfig(id="../../escaped", model=str(tmp_path)),), source="api")
    with pytest.raises(UsageError, match=r"^api: \[models\.\.\./\.\./escaped\]: a model id"):
        make_router(config, inventory=load_inventory("cpu-only.json"), lock_dir=tmp_path)


def test_a_remote_model_needs_no_path() -> None:
    config = parse_config({"models": {"hf": {"args": ["-hf", "org/model-GGUF"]}}})
    assert config.by_id("hf").model is None


def test_the_file_toml_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "models.toml"
    bad.write_text("[models.a\nmodel = 1\n")
    with pytest.raises(UsageError, match="not valid TOML: Expected") as raised:
        read_config(bad)
    assert raised.value.cli_message().startswith(f"--config {bad}: not valid TOML")
    with pytest.raises(UsageError, match="cannot read it"):
        read_config(tmp_path / "missing.toml")


def test_a_config_nested_thousands_deep_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "models.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")  # RecursionError in tomllib
    with pytest.raises(UsageError, match="nested too deeply"):
        read_config(deep)


# -- decisions -------------------------------------------------------------------------------
def view(model: str, used_s: float, **changes: object) -> ModelView:
    fields: dict[str, object] = {"state": READY, "last_used_s": used_s, **changes}
    return ModelView(model, **fields)  # type: ignore[arg-type]


def test_ttl_unloads_only_idle_models_past_their_ttl() -> None:
    views = [
        view("old", 0, ttl_s=10), view("fresh", 95, ttl_s=10), view("forever", 0),
        view("busy", 0, ttl_s=10, in_flight=1),
        view("loading", 0, ttl_s=10, state=ModelState.LOADING),
    ]  # fmt: skip
    assert expired(views, now_s=100) == ["old"]
    assert next_expiry(views) == 10  # old's; then fresh's at 105
    assert next_expiry([view("fresh", 95, ttl_s=10)]) == 105
    assert next_expiry([view("forever", 0)]) is None


def test_eviction_takes_expired_models_first_then_the_least_recently_used() -> None:
    views = [
        view("recent", 90), view("lru", 10), view("expired", 50, ttl_s=5),
        view("pinned", 0, pinned=True), view("busy", 0, in_flight=2), view("me", 0),
        view("loading", 0, state=ModelState.LOADING),
    ]  # fmt: skip
    assert eviction_order(views, now_s=100, exclude="me") == ["expired", "lru", "recent"]


def test_the_fewest_evictions_that_make_it_fit() -> None:
    # "a" sits on the one device the new model can use; "b" and "c" elsewhere.
    def attempt(evicted: frozenset[str]) -> Outcome:
        return Outcome.FITS if "a" in evicted else Outcome.NONE

    assert choose_evictions(attempt, ["b", "a", "c"]) == ("a",)  # b would not help
    assert choose_evictions(lambda e: Outcome.FITS, ["b"]) == ()
    assert choose_evictions(lambda e: Outcome.NONE, ["a", "b"]) is None


def test_evicting_for_a_full_fit_before_settling_for_a_partial_one() -> None:
    def attempt(evicted: frozenset[str]) -> Outcome:
        return Outcome.FITS if {"a", "b"} <= evicted else Outcome.PARTIAL

    assert choose_evictions(attempt, ["a", "b", "c"]) == ("a", "b")
    # Nothing makes it fit: it starts partly offloaded (--fit) rather than evicting for nothing.
    assert choose_evictions(lambda e: Outcome.PARTIAL, ["a"]) == ()

    def placed_only_if(evicted: frozenset[str]) -> Outcome:
        return Outcome.PARTIAL if "a" in evicted else Outcome.NONE

    assert choose_evictions(placed_only_if, ["a", "b"]) == ("a",)


def test_round_robin_skips_replicas_that_are_down() -> None:
    assert next_replica([True, True, True], 0) == 0
    assert next_replica([True, True, True], 4) == 1
    assert next_replica([True, False, True], 1) == 2
    assert next_replica([False, False], 0) is None


def test_devices_of_our_own_models_are_planned_as_they_were_before_they_loaded() -> None:
    from dataclasses import replace

    from helpers import load_inventory
    from xpulaunch.llamacpp.router.policy import with_readings

    before = load_inventory("2x-h200.json")
    busy = [replace(d, memory_used_bytes=100 * 2**30) for d in before.devices]
    now = replace(before, devices=tuple(busy))  # a fresh probe sees our model's memory
    ours = before.devices[0]
    planned = with_readings(now, {ours.key: ours})
    assert planned.devices[0] is ours and planned.devices[1] is busy[1]
    assert with_readings(now, {}) is now


def test_a_model_chooses_its_gpus_by_topology() -> None:
    from xpulaunch.llamacpp.router.setup import Setup, model_request
    from xpulaunch.llamacpp.server import HealthOptions
    from xpulaunch.model import Inventory
    from xpulaunch.supervisor.restart import RestartPolicy

    tables = {
        "big": {"model": "/m/big.gguf", "gpus": "2", "topology": "require"},
        "small": {"model": "/m/small.gguf"},
    }
    config = parse_config({"models": tables}, source="models.toml")
    big = config.by_id("big")
    assert big.topology == "require" and config.by_id("small").topology == "prefer"
    assert big.as_dict()["topology"] == "require"
    setup = Setup(Inventory(), {}, HealthOptions(), RestartPolicy())
    assert model_request(big, setup).topology == "require"
    with pytest.raises(UsageError, match=r"\[models.big\] topology: 'near'; expected one of"):
        parse_config(
            {"models": {"big": {"model": "/m/big.gguf", "topology": "near"}}}, source="models.toml"
        )
