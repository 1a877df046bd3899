"""`python -m amdflash`: the command line."""
from amdflash.pipeline.cli import entry

entry()
