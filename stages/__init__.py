"""The flash operations (one module per stage) and the layers beneath them."""
