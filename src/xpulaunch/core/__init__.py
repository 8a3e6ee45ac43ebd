"""Pure decisions: masks, visibility, device selection, placement, the plan and its documents,
restart decisions, node layouts, config merging. No OS, no environment reads, no clock, no
subprocess (ruff's banned-api keeps it so): everything is an argument."""
