# Exit non-zero when the state at argv[1] is unusable.
import sys
from pathlib import Path

root = Path(sys.argv[1])
done = root / "DONE"
if done.exists() and done.read_bytes() == b"ok":
    sys.exit((root / "weights.bin").read_bytes() != b"w" * 8192)
