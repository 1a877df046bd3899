from tests.pipeline.cli.conftest import amdflash, isolated  # noqa: F401 - the CLI fixtures: own database, locks, config
