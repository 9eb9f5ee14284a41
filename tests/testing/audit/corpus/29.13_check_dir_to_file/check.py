# Exit non-zero when the state at argv[1] is unusable; then turn d/ into a file (a check
# that modifies the state: the next state must still show d/ with its files).
import shutil
import sys
from pathlib import Path

d = Path(sys.argv[1]) / "d"
if d.is_dir():
    x = d / "x"
    bad = x.exists() and x.read_bytes() not in (b"x" * 100, b"y" * 100)
    shutil.rmtree(d)
    d.write_bytes(b"")
    sys.exit(bad)
