# Exit non-zero when the file is two slots long (slot 0 done) but slot 0 is neither whole
# nor empty (zeros: an empty slot is fine).
import sys
from pathlib import Path

slots = Path(sys.argv[1]) / "slots"
data = slots.read_bytes() if slots.exists() else b""
if len(data) == 8192:
    sys.exit(data[:4096] not in (b"r" * 4096, bytes(4096)))
