# an async loader's check, given to --check-python: its coroutine is never awaited
from pathlib import Path


async def check(root: str) -> bool:
    p = Path(root) / "1" / "weights.bin"
    return not p.parent.is_dir() or (p.exists() and p.read_bytes() == b"w" * 4096)
