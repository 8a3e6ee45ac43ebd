"""The one orchestrator of a run: a :class:`~xpulaunch.launch.request.RunRequest` -> this
node's place -> probe -> plan and lease -> the nodes' meeting -> supervise. No click, no
printing."""
