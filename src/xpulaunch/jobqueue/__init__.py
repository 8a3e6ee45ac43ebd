"""The job queue of a lock directory: ``xpulaunch submit`` now, run when devices come free.

``user_store`` (each user's records, ``queue-jobs-<uid>/queue.sqlite``, written by that
user alone), ``store`` (all users' records read together), ``files`` (each user's folder
and private job folders, the job ids given out, the runner's lock and wake-up pipe),
``runner`` (starts each user's queued jobs as ``xpulaunch run --wait`` processes and
records how they end),
``job_process`` (one job's process: start, adopt, exit status), ``actions`` (submit, cancel,
hold, release), ``listing`` (what ``xpulaunch queue`` and ``top`` show) and ``mounts``
(refusing a network filesystem). The decisions themselves are pure, in
:mod:`xpulaunch.jobqueue.policy`.
"""
