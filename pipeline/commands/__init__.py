"""The commands as plain functions with typed results: the API, and the command line's only way in."""
