"""`python -m amdflash.pipeline.cli`: the command line.

Exporter configurations written by earlier versions start amdflash this way."""
from amdflash.pipeline.launch import run

run()
