# Exit non-zero when the state at argv[1] is unusable.
import sys
from pathlib import Path

root = Path(sys.argv[1])
if (root / "OK").exists():
    sys.exit((root / "b.bin").read_bytes() != b"b" * 4096)
