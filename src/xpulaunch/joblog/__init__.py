"""What a run leaves behind and shows: the console and log files, the events stream,
``summary.json``, the metrics endpoint, the failure report and the log reader. Knows nothing
of the supervisor's insides: it is fed events and statuses."""
