# The user's existing checkpoint directory, made before the audit: latest.bin is a hard
# link to step-1.bin (one file, two names), as a "latest" alias made with os.link is.
import os

os.makedirs("ckpts")
with open("ckpts/step-1.bin", "wb") as f:
    f.write(b"1" * 4096)
os.link("ckpts/step-1.bin", "ckpts/latest.bin")
