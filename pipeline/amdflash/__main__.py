"""`python -m amdflash`: the command line."""
from amdflash.pipeline.launch import run

run()
