"""The model router of ``xpulaunch llama serve`` and :func:`serve_models`: several llama.cpp
models behind one OpenAI-compatible port, each loaded on demand onto leased devices.

Pure parts: :mod:`.config` (``models.toml``) and :mod:`.policy` (ttl, eviction, round
robin). :mod:`.slot` and :mod:`.models` load and unload models under the Supervisor;
:mod:`.proxy` (aiohttp) is the HTTP front, :mod:`.metrics` its ``/metrics``; :mod:`.router`
runs it all on a thread of its own; :mod:`.serve` is the call most users want. aiohttp is
imported only when a router starts (the ``serve`` extra installs it).
"""
