# A socket left in the directory breaks the resume (a copy of the directory fails on it).
import os
import sys

sys.exit(os.path.exists(os.path.join(sys.argv[1], "control.sock")))
