"""How a job runs: the runner, the stage graphs, jobs per transport kind, events, progress, interrupts."""
