# Exit non-zero when the state at argv[1] is unusable.
import sys
from pathlib import Path

root = Path(sys.argv[1])
if (root / "DONE").exists():
    sys.exit((root / "weights.bin").read_bytes() != b"w" * 8192)
