# The checkpoint must not hold the scratch bytes.
import os
import sys

with open(os.path.join(sys.argv[1], "w"), "rb") as f:
    sys.exit(b"BAD!" in f.read())
