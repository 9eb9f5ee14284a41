# Exit non-zero when the state at argv[1] is unusable.
import sys
from pathlib import Path

root = Path(sys.argv[1])
sys.exit((root / "meta.json").exists() and not (root / "weights.bin").exists())
