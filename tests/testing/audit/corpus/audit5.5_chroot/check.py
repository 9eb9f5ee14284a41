# w holds its 4096 bytes.
import os
import sys

p = os.path.join(sys.argv[1], "w")
sys.exit(not os.path.exists(p) or os.path.getsize(p) != 4096)
