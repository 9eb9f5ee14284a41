# Exit non-zero when the state at argv[1] is unusable.
import sys
from pathlib import Path

p = Path(sys.argv[1]) / "weights.bin"
sys.exit(p.exists() and p.stat().st_size != 8192)
