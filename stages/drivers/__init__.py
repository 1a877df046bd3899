"""Drivers over BAR5: the Navi31 blocks (ROM_SW engine, ROM aperture, PSP mailbox) and the SPI NOR chips."""
