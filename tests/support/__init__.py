"""What many tests share: running the command line, reading the audit trail, the repository's paths."""
