"""Several nodes, one job: the whole multi-node story.

Pure rules: :mod:`.settings` (the node options and what they mean together), :mod:`.cluster`
(a Slurm or Kubernetes allocation read from the environment), :mod:`.hostlist` (Slurm's host
list syntax), :mod:`.elastic` (torch's c10d agent's plan) and :mod:`.protocol` (the messages
nodes exchange). The shell: :mod:`.slurm` (asks ``scontrol``), :mod:`.member` (the story of a
static job's meeting, and a node that is not node 0), :mod:`.hub` (node 0's side),
:mod:`.link` (what every node has) and :mod:`.job` (one node wired into its supervisor).
"""
