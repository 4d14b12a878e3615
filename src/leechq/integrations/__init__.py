"""Layer 7: adapters to host frameworks (transformers); import-guarded."""
