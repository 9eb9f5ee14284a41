"""Layer 1: every on-disk name with its parsers, and the error hierarchy."""
