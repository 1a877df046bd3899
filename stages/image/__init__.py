"""Firmware images, read without any board: IFWI partitions, the ATOM VBIOS in each, and the part check."""
