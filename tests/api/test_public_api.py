"""The public surface: xpulaunch.__all__ is locked, every name resolves, and the Python API
does what the CLI does (contract section 5)."""

from __future__ import annotations

import ast
import importlib
import math
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

import xpulaunch
from helpers import inventory_path
from xpulaunch.joblog.logs import LogLayout
from xpulaunch.launch.request import Backoff

EXPECTED = {
    "Backend", "Device", "DeviceBusyError", "DeviceMap", "DeviceShare", "Event", "Exited", "GaveUp",
    "HangDetected", "HealthCheck", "Hierarchy", "Inventory", "InventoryError", "LaunchError",
    "Lease", "LeaseError", "LeaseManager", "LlamaServer", "LogConfig", "MaskError", "MigDevice",
    "NodeGroup", "Plan", "ProbeError", "Problem", "QueueError", "Ready", "RestartMode",
    "RestartPolicy",
    "Restarting", "RunRequest", "SelectionError", "ServerStartError", "Started", "Stopped",
    "Stopping", "Supervisor", "SupervisorSettings", "TimedOut", "Unhealthy", "Unit",
    "UsageError", "Vendor", "WaitTimeoutError", "WorkerFailedError", "WorkerPlan", "WorkerSpec",
    "WorkerState", "WorkerStatus", "XpulaunchError", "heartbeat", "inventory_document",
    "load_inventory", "plan", "plan_document", "plan_llama", "probe", "run", "serve_llama",
    "serve_models",
    "worker_specs",
}  # fmt: skip


def test_all_is_the_export_table_and_dir() -> None:
    table = {name for names in xpulaunch._EXPORTS.values() for name in names}
    assert set(xpulaunch.__all__) == table == EXPECTED
    assert len(xpulaunch.__all__) == len(table)  # no name twice
    public = {n for n in dir(xpulaunch) if not n.startswith("_")}
    assert public == EXPECTED


@pytest.mark.parametrize("face", ["xpulaunch", "xpulaunch.leases", "xpulaunch.llamacpp"])
def test_the_type_checking_imports_repeat_the_table(face: str) -> None:
    """Type checkers read the ``if TYPE_CHECKING:`` imports; they must name the same objects
    as the lazy table of each face that has one."""
    package = importlib.import_module(face)
    tree = ast.parse(Path(package.__file__).read_text())
    guard = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n))
    imported = {
        (node.module, alias.name)
        for node in guard.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    table = {(module, name) for module, names in package._EXPORTS.items() for name in names}
    assert imported == table
    assert sorted(package.__all__) == sorted(name for _, name in table)
    for module, name in table:  # each name is the object its module defines
        assert getattr(package, name) is getattr(importlib.import_module(module), name)


def _modules() -> list[str]:
    root = Path(xpulaunch.__file__).parent
    return sorted(
        "xpulaunch." + ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for p in root.rglob("*.py")
        if p.name != "__main__.py"
    )


def test_importing_every_module_leaves_every_public_name_what_it_was() -> None:
    """A subpackage with a public name's name would rebind the attribute when imported
    (``xpulaunch.probe`` was once both the function and the hardware subpackage)."""
    before = {name: getattr(xpulaunch, name) for name in EXPECTED}
    for module in _modules():
        importlib.import_module(module)
    for name in EXPECTED:
        assert getattr(xpulaunch, name) is before[name], name
        assert not isinstance(before[name], types.ModuleType), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(xpulaunch, name) is not None
    assert name in dir(xpulaunch)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        xpulaunch.nope  # noqa: B018


def test_py_typed_ships() -> None:
    assert (Path(xpulaunch.__file__).parent / "py.typed").is_file()


def test_import_is_cheap_and_loads_no_supervisor_or_torch() -> None:
    code = (
        "import sys, xpulaunch; "
        "bad = [m for m in ('torch', 'psutil', 'xpulaunch.supervisor.supervisor', 'pynvml') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_plan_matches_the_cli_document() -> None:
    plan = xpulaunch.plan(
        ["python", "-c", "pass"], gpus="2", nproc_per_node=None, master_port=29511,
        inventory=str(inventory_path("2x-h200.json")), parent_env={},
    )  # fmt: skip
    doc = xpulaunch.plan_document(plan)
    assert doc["backend"] == "cuda" and len(doc["workers"]) == 2
    assert doc["workers"][1]["env"]["MASTER_PORT"] == "29511"


def test_supervisor_runs_a_planned_cpu_job(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    script = tmp_path / "job.py"
    script.write_text(
        f"import os\nopen({str(out)!r} + os.environ['RANK'], 'w').write(os.environ['WORLD_SIZE'])\n"
    )
    plan = xpulaunch.plan([str(script)], gpus="none", nproc_per_node=2, parent_env={})
    specs = xpulaunch.worker_specs(plan, {"PATH": "/usr/bin:/bin"})
    with xpulaunch.Supervisor(specs, xpulaunch.RestartPolicy(gang=True)) as supervisor:
        supervisor.start()
        assert supervisor.wait(timeout=60) == 0
    assert (tmp_path / "out.txt0").read_text() == "2"
    assert (tmp_path / "out.txt1").read_text() == "2"


# serve_llama starts real llama-server processes: tests/llamacpp/test_server.py runs it with the
# real binary and a tiny model; serve_models starts a router: tests/llamacpp/test_router*.py.
NOT_CALLED_HERE = {"serve_llama", "serve_models"}


def _calls(tmp_path: Path) -> dict[str, Callable[[], object]]:
    """One cheap, valid call of every public function (inventories from the fixtures)."""
    from xpulaunch.llamacpp import LlamaBackend, LlamaRequest

    env = {"PATH": "/usr/bin:/bin"}
    inventory = xpulaunch.load_inventory(inventory_path("2x-h200.json"))
    cpu_plan = xpulaunch.plan(["true"], gpus="none", parent_env=env)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")  # read, but not a model: no estimate
    llama = LlamaRequest(
        model=str(tmp_path / "model.gguf"), gpus="2", binary=str(tmp_path / "llama-server"),
        llama_backend=LlamaBackend.CUDA,
    )  # fmt: skip
    return {
        "probe": lambda: xpulaunch.probe(env),
        "load_inventory": lambda: xpulaunch.load_inventory(inventory_path("8x-h100.json")),
        "inventory_document": lambda: xpulaunch.inventory_document(inventory),
        "plan": lambda: xpulaunch.plan(["true"], gpus="2", inventory=inventory, parent_env=env),
        "plan_document": lambda: xpulaunch.plan_document(cpu_plan),
        "plan_llama": lambda: xpulaunch.plan_llama(llama, inventory, env, dry_run=True),
        "worker_specs": lambda: xpulaunch.worker_specs(cpu_plan, env),
        "run": lambda: xpulaunch.run(["true"], gpus="none", parent_env=env),
        "heartbeat": xpulaunch.heartbeat,  # outside a run: does nothing
    }


def test_every_public_function_can_be_called_twice(tmp_path: Path) -> None:
    functions = {n for n in EXPECTED if isinstance(getattr(xpulaunch, n), types.FunctionType)}
    calls = _calls(tmp_path)
    assert set(calls) == functions - NOT_CALLED_HERE
    for name, call in sorted(calls.items()):
        first, second = call(), call()
        assert type(first) is type(second), name


def test_probe_reports_what_devices_debug_shows() -> None:
    """A missing tool or library is a problem the caller can read, not silence."""
    inventory = xpulaunch.probe({"PATH": "/nonexistent"})
    assert inventory.problems, "a host without any vendor tool must say so"


def test_api_errors_name_the_keyword_and_the_cli_form_names_the_flag() -> None:
    inventory = str(inventory_path("2x-h200.json"))
    with pytest.raises(xpulaunch.SelectionError) as raised:
        xpulaunch.plan(["true"], gpus="3", inventory=inventory, parent_env={})
    assert str(raised.value).startswith("gpus='3': only 2 free device(s) of 2 visible")
    assert raised.value.cli_message().startswith("--gpus 3: only 2 free device(s)")
    with pytest.raises(xpulaunch.UsageError) as malformed:
        xpulaunch.plan(["true"], gpus="lots", inventory=inventory, parent_env={})
    assert malformed.value.message.startswith("gpus='lots': expected auto, all, none")
    assert malformed.value.cli_message().startswith("--gpus 'lots': expected auto, all, none")
    with pytest.raises(xpulaunch.InventoryError) as missing:
        xpulaunch.plan(["true"], inventory="/nonexistent.json", parent_env={})
    assert missing.value.message.startswith("inventory='/nonexistent.json': cannot read it")
    assert missing.value.cli_message().startswith("--inventory /nonexistent.json: cannot read")


def test_a_uuid_prefix_selects_the_device_it_starts() -> None:
    plan = xpulaunch.plan(
        ["true"], gpus="GPU-e436550d", inventory=str(inventory_path("2x-h200.json")),
        parent_env={},
    )  # fmt: skip
    assert [d.device.index for d in plan.devices] == [1]


def test_the_old_name_of_health_check_is_gone() -> None:
    """``Probe`` was a deprecated alias of ``HealthCheck``: a 0.1.0 package needs no shims."""
    with pytest.raises(AttributeError, match="Probe"):
        xpulaunch.Probe  # noqa: B018
    assert "Probe" not in dir(xpulaunch)


@pytest.mark.parametrize(
    ("program", "options", "message"),
    [
        ("true", {}, "program='true': expected the argv as a list of strings"),  # ran "t"
        (None, {}, "program=None: expected the argv"),  # TypeError: not iterable
        ([1], {}, "program=[1]: expected strings only"),  # AttributeError: .endswith
        (["true"], {"gpus": 2}, "gpus=2: expected str"),  # AttributeError: .strip
        (["true"], {"nproc_per_node": "2"}, "nproc_per_node='2': expected int or None"),
        (["true"], {"max_restarts": "1"}, "max_restarts='1': expected int or None"),
        (["true"], {"grace_s": "10"}, "grace_s='10': expected a number"),
        (["true"], {"grace_s": math.nan}, "grace_s=nan: expected a number"),  # ran, no error
        (["true"], {"metrics_port": "x"}, "metrics_port='x': expected int or None"),
        (["true"], {"bogus": 1}, "bogus=1: not an option of run"),  # TypeError from __init__
        (["true"], {"restart": "sometimes"}, "restart='sometimes': expected one of no,"),
        (["true"], {"log_layout": "tree"}, "log_layout='tree': expected one of xpulaunch,"),
    ],
)
def test_run_refuses_a_wrong_type_with_a_usage_error(
    program: object, options: dict[str, object], message: str
) -> None:
    with pytest.raises(xpulaunch.UsageError) as raised:
        xpulaunch.run(program, parent_env={"PATH": "/usr/bin:/bin"}, **{"gpus": "none", **options})  # type: ignore[arg-type]
    assert str(raised.value).startswith(message)


def test_run_takes_the_words_of_the_options_choices(tmp_path: Path) -> None:
    """restart="on-failure" as on the command line; a plain string compared with `is` used
    to restart nothing ("gave up: no restarts were requested")."""
    marker = tmp_path / "failed-once"
    script = f"[ -e {marker} ] && exit 0; touch {marker}; exit 3"
    status = xpulaunch.run(
        ["sh", "-c", script], gpus="none", restart="on-failure", max_restarts=1,
        backoff=Backoff(0.0, 0.0, 1.0), parent_env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert status == 0
    options = xpulaunch.RunRequest(program=("x",), restart="always", log_layout="torchrun")  # type: ignore[arg-type]
    assert options.restart is xpulaunch.RestartMode.ALWAYS
    assert options.log_layout is LogLayout.TORCHRUN


def test_a_restart_policy_takes_the_words_of_its_modes() -> None:
    """The Supervisor's RestartPolicy(mode="always") restarted nothing before."""
    assert xpulaunch.RestartPolicy(mode="always").mode is xpulaunch.RestartMode.ALWAYS  # type: ignore[arg-type]
    with pytest.raises(xpulaunch.UsageError, match="mode='x': expected one of no, on-failure"):
        xpulaunch.RestartPolicy(mode="x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("program", "options", "message"),
    [
        ("true", {}, "program='true': expected the argv as a list of strings"),
        (["true"], {"gpus": 2}, "gpus=2: expected str"),  # AttributeError: .strip
        (["true"], {"nproc_per_node": "2"}, "nproc_per_node='2': expected int or None"),
        (["true"], {"min_free_memory_bytes": "1"}, "min_free_memory_bytes='1': expected int"),
        (["true"], {"max_utilization_percent": math.nan}, "max_utilization_percent=nan"),
        (["true"], {"master_port": "29500"}, "master_port='29500': expected int or None"),
    ],
)
def test_plan_refuses_a_wrong_type_with_a_usage_error(
    program: object, options: dict[str, object], message: str
) -> None:
    with pytest.raises(xpulaunch.UsageError) as raised:
        xpulaunch.plan(program, inventory=str(inventory_path("2x-h200.json")), parent_env={},
                       **options)  # type: ignore[arg-type]  # fmt: skip
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("workers", "fields", "message"),
    [
        (["true"], {}, "workers=['true']: expected a list of WorkerSpec"),  # .name
        ({"a": 1}, {}, "workers={'a': 1}: expected a list of WorkerSpec"),
        (None, {}, "workers=None: expected a list of WorkerSpec"),  # not iterable
        ("spec", {"grace_s": "5"}, "grace_s='5': expected 0 or more seconds"),  # TypeError: <
        ("spec", {"grace_s": math.nan}, "grace_s=nan: expected 0 or more seconds"),  # taken
        ("spec", {"max_runtime_s": "9"}, "max_runtime_s='9': expected a number of seconds"),
    ],
)
def test_supervisor_refuses_what_is_no_worker_or_no_seconds(
    workers: object, fields: dict[str, object], message: str
) -> None:
    if workers == "spec":
        workers = [xpulaunch.WorkerSpec(name="w", argv=("true",), env={})]
    with pytest.raises(xpulaunch.UsageError) as raised:
        xpulaunch.Supervisor(workers, **fields)  # type: ignore[arg-type]
    assert str(raised.value).startswith(message)


def test_serve_models_refuses_what_is_no_config() -> None:
    with pytest.raises(xpulaunch.UsageError, match=r"config=None: expected a models\.toml path"):
        xpulaunch.serve_models(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: xpulaunch.plan_document(None), "plan=None: expected a Plan"),  # .devices
        (lambda: xpulaunch.inventory_document({}), "inventory={}: expected an Inventory"),
        (lambda: xpulaunch.worker_specs("plan"), "plan='plan': expected a Plan"),
        (lambda: xpulaunch.load_inventory(None), "path=None: expected the path of an inventory"),
        (
            lambda: xpulaunch.serve_llama("m.gguf", replicas="2", inventory=_no_gpu()),
            "replicas='2': expected int",
        ),  # TypeError: '<' (or the missing binary first)
        (
            lambda: xpulaunch.serve_llama("m.gguf", replicas=0, inventory=_no_gpu()),
            "replicas=0: expected 1 or more",
        ),
        (
            lambda: xpulaunch.serve_llama("m.gguf", port=70000, inventory=_no_gpu()),
            "port=70000: expected a port from 1 to 65535",
        ),
        (lambda: xpulaunch.serve_llama(3, inventory=_no_gpu()), "model=3: expected str or None"),
        (
            lambda: xpulaunch.serve_llama("m.gguf", args="-c 512", inventory=_no_gpu()),
            "args='-c 512': expected llama-server's arguments as a list of strings",
        ),  # not the letters '-', 'c', ' ', ... (llama-server: invalid argument: -)
        (
            lambda: xpulaunch.serve_llama("m.gguf", args=["-c", 512], inventory=_no_gpu()),
            "args=['-c', 512]: expected strings only",
        ),
    ],
)
def test_the_other_entry_points_refuse_a_wrong_type_with_a_usage_error(
    call: Callable[[], object], message: str
) -> None:
    with pytest.raises(xpulaunch.UsageError) as raised:
        call()
    assert str(raised.value).startswith(message)


def _no_gpu() -> xpulaunch.Inventory:
    return xpulaunch.load_inventory(inventory_path("cpu-only.json"))
