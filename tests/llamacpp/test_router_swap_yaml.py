"""A llama-swap ``config.yaml`` read as it is (``swap_yaml.translate``), and groups of models
(``groups.must_unload``): table tests of the pure translation, then real routers serving a
llama-swap file with stand-in engines and the real CPU llama-server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from xpulaunch.errors import UsageError
from xpulaunch.llamacpp.router.config import parse_config, read_config
from xpulaunch.llamacpp.router.groups import Group, must_unload, parse_groups
from xpulaunch.llamacpp.router.swap_yaml import translate

CWD = "/work/dir"


def tr(document: dict[str, Any], **environ: str) -> tuple[dict[str, Any], list[str]]:
    return translate(document, environ, source="config.yaml", cwd=CWD)


def one(entry: dict[str, Any], **environ: str) -> dict[str, Any]:
    translated, _ = tr({"models": {"m": entry}}, **environ)
    return translated["models"]["m"]


ENGINE = "vllm serve Qwen/Qwen3-8B --port ${PORT}"


# -- macros ------------------------------------------------------------------------------
def test_macros_global_model_nested_env_and_model_id() -> None:
    document = {
        "macros": {"bin": "/opt/vllm", "ctx": 4096, "args": "--ctx ${ctx}", "home": "${env.HOME}"},
        "models": {
            "q": {
                "macros": {"ctx": 16384},
                "cmd": "${bin} serve ${home}/m --port ${PORT} ${args} --served ${MODEL_ID}",
            }
        },
    }
    translated, warnings = tr(document, HOME="/home/u")
    assert translated["models"]["q"]["cmd"] == [
        "/opt/vllm", "serve", "/home/u/m", "--port", "${PORT}", "--ctx", "16384",
        "--served", "q",
    ]  # fmt: skip
    assert warnings == []


@pytest.mark.parametrize(
    ("document", "environ", "message"),
    [
        ({"cmd": "x --port ${PORT} ${nope}"}, {}, r"\$\{nope\} is not a macro"),
        ({"cmd": "x --port ${PORT} ${ctz}", "macros": {"ctx": 1}}, {}, r"did you mean \$\{ctx\}"),
        ({"cmd": "x --port ${PORT} ${env.MISSING}"}, {}, "MISSING is not set"),
        ({"cmd": "x --port ${PORT}", "macros": {"PORT": 1}}, {}, "cannot name a macro"),
        ({"cmd": "x --port ${PORT}", "macros": {"a b": 1}}, {}, "cannot name a macro"),
        ({"cmd": "x ${a}", "macros": {"a": "${b}", "b": "${a}"}}, {}, "without end"),
    ],
)
def test_bad_macros_are_one_line(
    document: dict[str, Any], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        one(document, **environ)


# -- commands -----------------------------------------------------------------------------
def test_a_block_cmd_loses_its_comment_lines_and_is_split_as_a_shell_would() -> None:
    cmd = "# the engine\nvllm serve 'my model'\n  # a note\n  --port ${PORT}\n"
    assert one({"cmd": cmd})["cmd"] == ["vllm", "serve", "my model", "--port", "${PORT}"]


def test_a_llama_server_cmd_becomes_a_llama_server_model() -> None:
    table = one(
        {
            "cmd": "/opt/llama-server-b123 --port ${PORT} --host 0.0.0.0 -m models/q.gguf "
            "--ctx-size 4096 -ngl 99",
            "checkEndpoint": "/health",
        }
    )
    assert table == {
        "binary": "/opt/llama-server-b123",
        "model": f"{CWD}/models/q.gguf",  # the working folder's, as llama-swap runs it
        "args": ["--ctx-size", "4096", "-ngl", "99"],
    }
    config = parse_config({"models": {"q": table}}, source="config.yaml")
    (model,) = config.models
    assert model.binary == "/opt/llama-server-b123" and model.cmd == ()


def test_a_llama_server_with_a_remote_model_keeps_hf() -> None:
    table = one({"cmd": "llama-server --port=${PORT} -hf org/model-GGUF"})
    assert table == {"binary": "llama-server", "args": ["-hf", "org/model-GGUF"]}
    (model,) = parse_config({"models": {"q": table}}, source="c").models
    assert model.model is None


def test_a_fixed_proxy_port_becomes_the_routers_choice() -> None:
    table = one({"cmd": "server --port 8999 --x 89990", "proxy": "http://127.0.0.1:8999"})
    assert table["cmd"] == ["server", "--port", "${PORT}", "--x", "89990"]
    docker = one({"cmd": "docker run -p 9000:8080 image", "proxy": "http://localhost:9000/"})
    assert docker["cmd"] == ["docker", "run", "-p", "${PORT}:8080", "image"]
    assert one({"cmd": ENGINE, "proxy": "http://127.0.0.1:${PORT}"})["cmd"][-1] == "${PORT}"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"cmd": "server --port 1", "proxy": "http://10.0.0.2:8999"}, "expected http://127.0"),
        ({"cmd": "server --port 1", "proxy": "http://127.0.0.1:8999"}, "port 8999 is not in cmd"),
        ({"cmd": "server 'open"}, "cannot be split"),
        ({"cmd": "# only a comment"}, "empty"),
        ({"proxy": "http://127.0.0.1:1"}, "no cmd"),
        ({"cmd": ENGINE, "env": ["NOEQUALS"]}, 'expected "NAME=value"'),
        ({"cmd": ENGINE, "env": {"A": "1"}}, "list of"),
        ({"cmd": ENGINE, "concurrencyLimit": -1}, "concurrencyLimit"),
        ({"cmd": "llama-server --port ${PORT} -m"}, "-m has no value"),
    ],
)
def test_bad_models_are_one_line(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        one(entry)


def test_keys_that_mean_what_models_toml_means() -> None:
    table = one(
        {
            "cmd": ENGINE,
            "ttl": 60,
            "aliases": ["gpt-4o-mini"],
            "env": ["CUDA_VISIBLE_DEVICES=0", "X=a=b", "P=${p}"],
            "macros": {"p": "v"},
            "checkEndpoint": "none",
            "unlisted": True,
            "concurrencyLimit": 4,
            "memory": "20GiB",  # xpulaunch's own key: llama-swap does not read it
        }
    )
    assert table["env"] == {"CUDA_VISIBLE_DEVICES": "0", "X": "a=b", "P": "v"}
    assert table["max_concurrency"] == 4 and "max_queue" not in table  # 429 beyond, at once
    (model,) = parse_config({"models": {"m": table}}, source="c").models
    assert (model.ttl_s, model.aliases, model.unlisted, model.check) == (
        60.0, ("gpt-4o-mini",), True, "none")  # fmt: skip
    assert model.memory_bytes == 20 * 2**30


# -- the file's own keys ---------------------------------------------------------------------
def test_top_level_keys_preload_api_keys_timeout_and_start_port() -> None:
    document = {
        "healthCheckTimeout": 5,  # llama-swap raises it to 15
        "startPort": 10001,
        "apiKeys": ["sk-one", "${env.KEY2}"],
        "hooks": {"on_startup": {"preload": ["a"]}},
        "groups": {"g": {"members": ["a", "b"], "swap": False}},
        "models": {"a": {"cmd": ENGINE}, "b": {"cmd": ENGINE}},
    }
    translated, _ = tr(document, KEY2="sk-two")
    config = parse_config(translated, source="config.yaml")
    assert config.serve.api_keys == ("sk-one", "sk-two")
    assert (config.serve.ready_timeout_s, config.serve.start_port) == (15.0, 10001)
    assert [m.preload for m in config.models] == [True, False]
    assert config.groups == (Group("g", ("a", "b"), swap=False),)


def test_keys_not_taken_are_one_warning_line_each_with_the_nearest_name() -> None:
    document = {
        "logLevel": "debug",
        "sendLoadingState": True,
        "healthCheckTimout": 30,  # a typo
        "models": {
            "a": {"cmd": ENGINE, "name": "A", "cmdStop": "docker stop a", "tll": 5},
        },
    }
    _, warnings = tr(document)
    assert warnings == [
        "config.yaml: logLevel: not taken (the router logs to stderr; --events writes every "
        "event as JSON)",
        "config.yaml: sendLoadingState: not taken (streamed requests get SSE comment lines "
        "while a model loads)",
        "config.yaml: healthCheckTimout: unknown key, ignored; did you mean 'healthCheckTimeout'?",
        "config.yaml: models.a.name: not taken (GET /v1/models shows the id)",
        "config.yaml: models.a.cmdStop: not taken (a server is stopped with SIGTERM, then "
        "SIGKILL after --grace)",
        "config.yaml: models.a.tll: unknown key, ignored; did you mean 'ttl'?",
    ]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"models": {}}, "no models"),
        ([1, 2], "expected llama-swap's config"),
        ({"models": {"a": {"cmd": ENGINE}}, "hooks": {"on_startup": {"preload": ["b"]}}},
         "'b' is not a model"),
        ({"models": {"ab": {"cmd": ENGINE}}, "hooks": {"on_startup": {"preload": ["abc"]}}},
         "did you mean 'ab'"),
        ({"models": {"a": {"cmd": ENGINE}}, "apiKeys": "sk"}, "apiKeys: expected a list"),
        ({"models": {"a": {"cmd": ENGINE}}, "healthCheckTimeout": "x"}, "healthCheckTimeout"),
    ],
)  # fmt: skip
def test_bad_files_are_one_line(document: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        tr(document)


# -- groups ------------------------------------------------------------------------------------
GROUPS = (
    Group("one", ("a", "b")),  # swap, exclusive
    Group("together", ("c", "d"), swap=False, exclusive=False),
    Group("forever", ("e",), swap=False, exclusive=False, persistent=True),
)
LOADED = ["a", "b", "c", "d", "e", "free"]


@pytest.mark.parametrize(
    ("model", "unloaded"),
    [
        ("a", ["b", "c", "d", "free"]),  # its group swaps; exclusive: all but persistent ones
        ("c", []),  # runs beside everything
        ("e", []),
        ("free", []),  # in no group: placed by memory alone
    ],
)
def test_what_a_group_unloads(model: str, unloaded: list[str]) -> None:
    assert must_unload(model, GROUPS, LOADED) == unloaded


def test_a_swap_group_that_is_not_exclusive_swaps_only_its_members() -> None:
    groups = (Group("g", ("a", "b"), exclusive=False),)
    assert must_unload("a", groups, ["b", "x"]) == ["b"]


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"g": {"members": ["a", "zz"]}}, "'zz' is not a model"),
        ({"g": {"members": ["abc"]}}, "did you mean 'ab'"),
        ({"g": {"members": ["a"]}, "h": {"members": ["a"]}}, r"in \[groups.g\] already"),
        ({"g": {"members": ["a"], "swapp": True}}, "did you mean 'swap'"),
        ({"g": {"members": ["a"], "swap": "yes"}}, "expected true or false"),
        ({"g": {"members": "a"}}, "expected a list of model ids"),
    ],
)
def test_bad_groups_are_one_line(tables: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_groups(tables, ["a", "ab"], "models.toml")


def test_groups_in_models_toml_too(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[models.a]\ncmd = "e --port ${PORT}"\n[models.b]\ncmd = "e --port ${PORT}"\n'
        '[groups.g]\nmembers = ["a", "b"]\nexclusive = false\n'
    )
    assert read_config(path).groups == (Group("g", ("a", "b"), exclusive=False),)


# -- files ---------------------------------------------------------------------------------------
def test_a_yaml_file_is_read_as_llama_swaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(
        "models:\n  q:\n    cmd: |\n      llama-server --port ${PORT}\n      -m q.gguf\n"
        "    logToStdout: proxy\n"
    )
    config = read_config(path)
    (model,) = config.models
    assert model.model == str(tmp_path / "q.gguf")
    assert config.warnings == (f"{path}: models.q.logToStdout: unknown key, ignored",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: [unclosed", "line 1"),
        ("models:\n  a:\n    cmd: x\n   bad: indent\n", "line 4"),
        ("- a list\n", "expected llama-swap's config"),
    ],
)
def test_a_bad_yaml_file_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as caught:
        read_config(path)
    assert "\n" not in caught.value.cli_message()
