"""``xpulaunch llama serve --config models.toml [--port 8080]``: several models behind one
OpenAI-compatible port, and ``--status`` of a running one."""

from __future__ import annotations

import json
import os
import signal
from typing import TYPE_CHECKING, Any

import click

from xpulaunch.cli.commands import CONTEXT_SETTINGS
from xpulaunch.cli.llama_options import llama_binary_options
from xpulaunch.cli.params import ANY_PORT, HOST, POSITIVE_SECONDS, SECONDS, Size
from xpulaunch.cli.render import print_plan
from xpulaunch.cli.terminal import aligned
from xpulaunch.cli.waiting import lock_dir_option
from xpulaunch.errors import UsageError

if TYPE_CHECKING:
    from xpulaunch.events import Event
    from xpulaunch.joblog.event_stream import EventStream
    from xpulaunch.llamacpp.router.config import RouterConfig
    from xpulaunch.llamacpp.router.router import Router
    from xpulaunch.model import Inventory

STATUS_TIMEOUT_S = 10.0


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    help="models.toml ([models.ID] tables), or a llama-swap config.yaml as it is.",
)
@click.option(
    "--port",
    type=ANY_PORT,
    default=8080,
    show_default=True,
    help="The one port clients use (0: a free port, printed).",
)
@click.option("--host", type=HOST, default="127.0.0.1", show_default=True, help="Address to bind.")
@llama_binary_options
@click.option(
    "--backend",
    envvar="XPULAUNCH_BACKEND",
    default="auto",
    show_default=True,
    metavar="auto|cuda|xpu|rocm|cpu",
    help="Vendor stack to use.",
)
@click.option(
    "--inventory",
    envvar="XPULAUNCH_INVENTORY",
    metavar="FILE",
    help="Use this inventory document instead of probing.",
)
@lock_dir_option
@click.option("--dry-run", is_flag=True, help="Print each model's plan as if it loaded now.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run or --status: JSON.")
@click.option(
    "--status",
    is_flag=True,
    help="Show the models of the router running at --host/--port, and exit.",
)
@click.option(
    "--reload",
    is_flag=True,
    help="Make the router running at --host/--port read its config file again (as SIGHUP "
    "does), say what changed, and exit.",
)
@click.option(
    "--ready-timeout",
    type=POSITIVE_SECONDS,
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="How long one model may take to answer /health.",
)
@click.option(
    "--grace",
    type=SECONDS,
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="On SIGTERM, answers under way get this long to finish; then each "
    "server gets SIGTERM, and this long before SIGKILL.",
)
@click.option(
    "--room-wait",
    type=SECONDS,
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How long a model waits for busy models to become idle and make room "
    "before its request gets 503 (0: at once).",
)
@click.option(
    "--yield-to-jobs/--no-yield-to-jobs",
    default=True,
    show_default=True,
    envvar="XPULAUNCH_YIELD_TO_JOBS",
    help="Unload idle, unpinned models from the GPUs a launch or queued job waits for "
    "(--wait), and place no model there meanwhile.",
)
@click.option(
    "--max-request-size",
    type=Size(),
    default="32MiB",
    show_default=True,
    metavar="SIZE",
    help="Larger request bodies get 413.",
)
@click.option(
    "--front-processes",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="Processes that forward on the port beside the router's own (for many requests at once).",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False),
    envvar="XPULAUNCH_LOG_DIR",
    help="Write DIR/MODEL/attempt_N/REPLICA.log for every server.",
)
@click.option(
    "--events",
    metavar="FILE|-",
    envvar="XPULAUNCH_EVENTS",
    help="Append every model and server event to FILE as JSON lines.",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    envvar="XPULAUNCH_API_KEY",
    metavar="KEY",
    help="Requests need Authorization: Bearer KEY (repeatable; with [serve] api_keys). "
    "Prefer $XPULAUNCH_API_KEY: a command line is visible to every user.",
)
def serve(
    config_path: str | None, status: bool, reload: bool, as_json: bool, **options: Any
) -> int:
    """Serve several llama.cpp models behind one OpenAI-compatible port. A model is loaded
    at its first request onto devices chosen and leased like any launch; when it cannot be
    placed, idle models are unloaded (ttl first, then least recently used; never pinned).

    \b
    [models.qwen]                      # the id clients send as "model"
    model = "/models/qwen-7b-q4.gguf"
    gpus = "auto"                      # the fewest free devices that hold it
    ttl = 600                          # unload after 10 idle minutes (0: never)
    args = ["-c", "8192"]              # llama-server's own options

    \b
    xpulaunch llama serve --config models.toml --port 8080
    xpulaunch llama serve --status --port 8080
    """
    if status:
        return _status(options["host"], options["port"], as_json, _auth(options["api_keys"]))
    if reload:
        return _reload(options["host"], options["port"], as_json, _auth(options["api_keys"]))
    if config_path is None:
        raise UsageError("--config FILE is needed (or --status to look at a running router)")
    from xpulaunch.llamacpp.router.router import check_models, load_config

    config = load_config(config_path)
    for warning in config.warnings:  # a llama-swap config's keys the router does not take
        click.echo(f"xpulaunch: warning: {warning}", err=True)
    check_models(config)
    env = dict(os.environ)
    from xpulaunch.llamacpp.launch import load_or_probe

    inventory = load_or_probe(options["inventory"], env)
    if options["dry_run"]:
        return _dry_run(config, inventory, env, options, as_json)
    if as_json:
        raise UsageError("--json goes with --dry-run or --status")
    return _serve(config, inventory, env, options)


def _router(
    config: RouterConfig,
    inventory: Inventory,
    env: dict[str, str],
    options: dict[str, Any],
    **extra: Any,
) -> Router:
    from xpulaunch.llamacpp.router.serve import make_router
    from xpulaunch.llamacpp.server import HealthOptions

    health = HealthOptions(ready_timeout_s=options["ready_timeout"], ready_interval_s=0.1)
    # --ready-timeout given wins over the config's (llama-swap's healthCheckTimeout).
    source = click.get_current_context().get_parameter_source("ready_timeout")
    given = source not in (None, click.core.ParameterSource.DEFAULT)
    return make_router(
        config,  # read once, here as in a reload (its source is the file)
        host=options["host"],
        port=options["port"],
        binary=options["binary"],
        llama_backend=options["llama_backend"],
        inventory=inventory,
        lock_dir=options["lock_dir"],
        backend=None if options["backend"] == "auto" else options["backend"],
        parent_env=env,
        health=health,
        grace_s=options["grace"],
        log_dir=options["log_dir"],
        max_body_bytes=options["max_request_size"] or 1,
        front_processes=options["front_processes"],
        reprobe=not options["inventory"],
        room_wait_s=options["room_wait"],
        yield_to_jobs=options["yield_to_jobs"],
        api_keys=options["api_keys"],
        ready_timeout_s=options["ready_timeout"] if given else None,
        **extra,
    )


def _dry_run(
    config: RouterConfig,
    inventory: Inventory,
    env: dict[str, str],
    options: dict[str, Any],
    as_json: bool,
) -> int:
    from xpulaunch import api
    from xpulaunch.llamacpp.router.serve import dry_run_plans

    router = _router(config, inventory, env, options)
    plans = dry_run_plans(router, this_host=not options["inventory"])
    if as_json:
        documents = {model: api.plan_document(plan.plan) for model, plan in plans.items()}
        click.echo(json.dumps({"models": documents}, indent=2))
        return 0
    for model, plan in plans.items():
        click.echo(f"model {model}:")
        print_plan(plan.plan, False, servers=True)
        click.echo("")
    return 0


def _serve(
    config: RouterConfig, inventory: Inventory, env: dict[str, str], options: dict[str, Any]
) -> int:
    from xpulaunch.launch.operations import open_events
    from xpulaunch.processes import sd_notify
    from xpulaunch.processes.signals import FORWARDED, forwarding

    stream = open_events(options["events"])
    router = _router(config, inventory, env, options, on_event=_writer(stream))
    stopping = tuple(s for s in FORWARDED if s != signal.SIGHUP)  # SIGHUP: read the config again
    try:
        with (
            forwarding(router.send_stop_signal, stopping),
            forwarding(router.send_reload_signal, (signal.SIGHUP,)),
        ):
            url = router.start()
            ids = ", ".join(router.config.ids)
            click.echo(f"xpulaunch: serving {ids} at {url}/v1 (models load on first use)")
            sd_notify.ready(f"serving {ids} at {url}/v1", env)  # Type=notify: port bound
            status = router.wait()
    finally:
        if stream is not None:
            stream.close()
    return 1 if status is None else status


def _writer(stream: EventStream | None) -> Any:
    if stream is None:
        return None

    def write(event: Event, model: str | None) -> None:
        stream.write(event, {"model": model} if model is not None else None)

    return write


def _auth(keys: tuple[str, ...]) -> dict[str, str]:
    """The header that asks a router with API keys (``--api-key``, ``$XPULAUNCH_API_KEY``)."""
    return {"Authorization": f"Bearer {keys[0]}"} if keys else {}


def _reload(host: str, port: int, as_json: bool, headers: dict[str, str]) -> int:
    """Ask the router at host:port to read its config again (standard library only)."""
    import http.client
    import urllib.error
    import urllib.request

    from xpulaunch.llamacpp.plan import url_host

    url = f"http://{url_host(host)}:{port}/models/reload"
    request = urllib.request.Request(url, data=b"{}", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=STATUS_TIMEOUT_S) as answer:
            document = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        message = _error_message(exc.read())
        raise UsageError(f"the router at {url} kept its config: {message}") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(f"no model router answers at {url} ({reason})") from None
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        for line in document.get("changes", []) if isinstance(document, dict) else []:
            click.echo(f"xpulaunch: reload: {line}")
    return 0


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]


def _status(host: str, port: int, as_json: bool, headers: dict[str, str]) -> int:
    """Ask the router at host:port (standard library: no aiohttp needed to look)."""
    import http.client
    import urllib.error
    import urllib.request

    from xpulaunch.llamacpp.plan import url_host

    url = f"http://{url_host(host)}:{port}/models/status"
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=STATUS_TIMEOUT_S) as answer:
            document = json.loads(answer.read())
    # HTTPException: what answers is no HTTP server (BadStatusLine), or the URL cannot be
    # sent (InvalidURL: a --host with a space); neither is an OSError or a ValueError.
    except (OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(
            f"no model router answers at {url} ({reason}); start one with "
            "xpulaunch llama serve --config FILE"
        ) from None
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise UsageError(
            f"what answers at {url} is not an xpulaunch model router (no list of models)"
        )
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(_status_table(models))
    return 0


def _status_table(models: list[dict[str, Any]]) -> str:
    rows = [("MODEL", "STATE", "IN FLIGHT", "IDLE", "TTL", "DEVICES", "REPLICAS")]
    for m in models:
        idle = "-" if m.get("idle_s") is None else f"{m['idle_s']:.0f} s"
        ttl = "never" if not m.get("ttl") else f"{m['ttl']:g} s"
        ttl += " (pinned)" if m.get("pinned") else ""
        replicas = ", ".join(
            f"{r['url']}" + ("" if r.get("up") else " (down)") for r in m.get("replicas", [])
        )
        state = str(m.get("state"))
        if m.get("loading_s") is not None:
            state += f" ({m['loading_s']:.0f} s)"
        rows.append(
            (
                str(m.get("id")),
                state,
                str(m.get("in_flight", 0)),
                idle,
                ttl,
                ", ".join(m.get("devices", [])) or "-",
                replicas or "-",
            )
        )
    errors = [f"{m['id']}: {m['last_error']}" for m in models if m.get("last_error")]
    return "\n".join([*aligned(rows), *(f"last error of {e}" for e in errors)]).rstrip()
