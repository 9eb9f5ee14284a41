import sys
from pathlib import Path

p = Path(sys.argv[1]) / "model.bin"
sys.exit(p.is_symlink() and (not p.exists() or p.read_bytes() != b"w" * 100))
