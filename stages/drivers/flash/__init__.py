"""SPI NOR flash: the chip table, status/protection decoding, SFDP and the command set."""
