"""`python -m amdflash`: the command line."""
from amdflash.launch import run

run()
