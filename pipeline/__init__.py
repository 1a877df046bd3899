"""Everything above the audit trail and the stages: the command line, the commands, the engine
that runs jobs, the fleet, and their common ground (errors, config, terminal, logging); the
floors between them are drawn in docs/architecture.md."""
