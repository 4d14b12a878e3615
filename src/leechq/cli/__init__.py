"""Layer 8: the command-line interface, a thin shell over the library."""
