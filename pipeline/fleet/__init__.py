"""A line of boards spread over many hosts, driven through labgrid.

Who does what:

* labgrid's coordinator knows every exporter, resource and place, and hands out
  reservations and locks (acquired places);
* one labgrid exporter per host publishes that host's boards as `NetworkAmdflashBoard`
  resources (`amdflash fleet exporter-config` writes its configuration);
* the fleet client (`amdflash fleet flash|dump|verify|info`) reserves and acquires the
  matching places, then runs each board's job on the board's own host over SSH — labgrid's
  way of running a command for a network resource — through `amdflash fleet job`, which
  drives the ordinary `amdflash` command line there.

The host's own SQLite audit trail stays the write-ahead log: a job never waits on the
coordinator or the client once it has started.

labgrid is optional (`pip install 'amdflash[fleet]'`); nothing here imports it until a
fleet command that needs it runs.
"""
from __future__ import annotations
