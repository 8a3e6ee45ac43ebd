"""The job queue of a lock directory: ``xpulaunch submit`` now, run when devices come free.

``store`` (the SQLite database ``queue.sqlite`` in the lock directory), ``files`` (each
user's private job folders, the runner's lock and wake-up pipe), ``runner`` (starts each
user's queued jobs as ``xpulaunch run --wait`` processes and records how they end),
``job_process`` (one job's process: start, adopt, exit status), ``actions`` (submit, cancel,
hold, release), ``listing`` (what ``xpulaunch queue`` and ``top`` show) and ``mounts``
(refusing a network filesystem). The decisions themselves are pure, in
:mod:`xpulaunch.jobqueue.policy`.
"""
