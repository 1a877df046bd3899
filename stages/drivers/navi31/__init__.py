"""The Navi31 blocks behind BAR5: ROM_SW engine, ROM aperture, PSP boot mailbox."""
