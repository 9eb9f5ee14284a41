# Exit non-zero when LATEST says step 2 but the state file holds step 1's write, whole.
import sys
from pathlib import Path

root = Path(sys.argv[1])
latest = root / "LATEST"
state = root / "state"
if latest.exists() and latest.read_text() == "2" and state.exists():
    sys.exit(state.read_bytes() == b"step=1;" + b"o" * 57)
