"""Layer 5: the facade over one root (``CheckpointDir``) and the asynchronous committer."""
