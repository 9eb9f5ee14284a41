import sys
from pathlib import Path

p = Path(sys.argv[1]) / "1"
sys.exit(
    p.is_dir()
    and (not (p / "weights.bin").exists() or (p / "weights.bin").read_bytes() != b"w" * 4096)
)
