"""Layer 4: the commit protocol and every operation on a root that follows it."""
