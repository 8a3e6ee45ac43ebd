"""Optional glue to torch and accelerate, imported lazily by the paths that need them (never
by a plain run: torch costs seconds, and a GPU context is the last thing a supervisor wants)."""
