# the body first, then seek back and write the header (magic, body length) last; no fsync:
# a power loss may keep the header and lose (or zero) the body
import os
import struct

os.makedirs("ckpts")
with open(os.path.join("ckpts", "blob"), "wb") as f:
    f.seek(8)
    f.write(b"b" * 8192)
    f.seek(0)
    f.write(b"HDR!" + struct.pack("<I", 8192))
