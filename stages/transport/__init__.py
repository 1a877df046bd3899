"""BAR5 access: the interface every transport implements, and the transports."""
