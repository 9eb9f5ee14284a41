# w is never longer than 4096 bytes.
import os
import sys

p = os.path.join(sys.argv[1], "w")
sys.exit(os.path.exists(p) and os.path.getsize(p) > 4096)
