"""The supervision engine: a :class:`~xpulaunch.supervisor.supervisor.Supervisor` runs
worker specs, one loop thread owning every worker, gang
restarts decided by :func:`xpulaunch.supervisor.restart.decide`, health and hang watches."""
