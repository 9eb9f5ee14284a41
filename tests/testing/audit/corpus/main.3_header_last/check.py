# Exit non-zero when the header is there but the body it describes is not whole.
import sys
from pathlib import Path

blob = Path(sys.argv[1]) / "blob"
data = blob.read_bytes() if blob.exists() else b""
if data[:4] == b"HDR!":
    n = int.from_bytes(data[4:8], "little")
    sys.exit(data[8 : 8 + n] != b"b" * n)
