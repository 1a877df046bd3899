"""The command line: one module per command group (argparse parsers, and how results are shown).

Nothing here runs a board: every command's checks and runs are in pipeline/commands/."""
