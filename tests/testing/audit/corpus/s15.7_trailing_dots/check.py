import sys
from pathlib import Path

p = Path(sys.argv[1]) / "1" / "w..."
sys.exit(p.exists() and p.read_bytes() != b"w" * 100)
