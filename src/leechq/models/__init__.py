"""Layer 5: model I/O (model zoo, architectures, loading and saving)."""
