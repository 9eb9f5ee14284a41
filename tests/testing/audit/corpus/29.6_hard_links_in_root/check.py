# Exit non-zero when the state at argv[1] is unusable: latest.bin must be one whole step.
import sys
from pathlib import Path

data = (Path(sys.argv[1]) / "latest.bin").read_bytes()
sys.exit(data not in (b"1" * 4096, b"2" * 4096))
