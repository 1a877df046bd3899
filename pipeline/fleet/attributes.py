"""What a line needs to know of a board, as published by its host's exporter (no labgrid import)."""
from __future__ import annotations

#: The resource class the exporters publish (a labgrid NetworkResource: it carries `host`).
RESOURCE_CLASS = "NetworkAmdflashBoard"

#: The board attributes, in the order the exporter configuration lists them: the spec the
#: host's `amdflash` takes, what identifies the flash, the host's audit database and the
#: `amdflash` command line on that host.
BOARD_ATTRIBUTES = ("spec", "kind", "chip", "jedec", "unique_id", "bridge_serial", "pci_address", "emulated",
                    "db", "command")
