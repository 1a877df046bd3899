"""A PSP update through amdgpu reads what an earlier update left in the driver's buffer through
the command's trail, not by opening the database by path mid-run (issue 43): a flash opens at
most 3 SQLite connections in the command's process, as one through BAR5 does."""
from __future__ import annotations

from amdflash.stages.sim.synth import synthetic_ifwi
from tests.support.connections import counted


def test_a_psp_update_opens_at_most_three_connections(cli, emulated, tmp_path):
    emu = emulated()
    image = tmp_path / "image.bin"
    image.write_bytes(synthetic_ifwi(9, part_key="SYNTH-0001"))
    assert cli("info", "--board", emu.spec).code == 0      # the trail exists, with a run of this device
    with counted() as opened:
        r = cli("flash", image, "--yes", "--board", emu.spec)
    assert r.code == 0, r.err
    assert emu.updates == 1
    assert len(opened) <= 3, "\n".join(opened)
