# Exit non-zero when the state at argv[1] is unusable: DONE promises m.bin holds the "b"s.
import sys
from pathlib import Path

root = Path(sys.argv[1])
if (root / "DONE").exists():
    sys.exit((root / "m.bin").read_bytes() != b"b" * 4096)
