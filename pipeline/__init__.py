"""How a job runs: job specs, the runner, multi-board scheduling, events, progress, the CLI."""
