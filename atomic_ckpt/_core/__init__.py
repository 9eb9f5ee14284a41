"""The core of atomic_ckpt, one folder per layer, each importing only from the layers below:

1. ``l1_names``: every on-disk name and the error hierarchy;
2. ``l2_syscalls``: the one module that changes the tree (``fs``), lock files, checksums,
   the fsync steps;
3. ``l3_formats``: the marker format, its parser, the tree walk, the read-only view, verify;
4. ``l4_protocol``: a root's settings and every operation that changes it, by the protocol;
5. ``l5_facade``: ``CheckpointDir`` and the asynchronous committer.

Nothing here imports torch or a framework; the public names are re-exported by ``atomic_ckpt``."""
