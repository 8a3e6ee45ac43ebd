"""The OS layer: spawning (own session, parent-death signal), process trees and their
signals, /proc, the guardian and the job record, cgroups, limits, program lookup, ports,
systemd readiness (sd_notify).
Knows nothing of workers, gangs or plans."""
