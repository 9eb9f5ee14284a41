"""Layer 2: the syscall module (``fs``), lock files, the checksum registry, the fsync steps."""
