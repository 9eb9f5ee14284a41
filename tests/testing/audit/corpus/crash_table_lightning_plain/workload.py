# The crash table's lightning_plain row (benchmarks/crash_table/lightning_plain.py), its
# file pattern copied without torch or Lightning: each save's bytes go to a temporary
# name, then replace last.ckpt (atomic for a kill), never fsynced: a power loss may keep
# the new name and lose its data. Three saves.
import os
import pickle

os.makedirs("ckpts")
for k in (1, 2, 3):
    with open("ckpts/last.ckpt.tmp", "wb") as f:
        pickle.dump({"k": k, "weights": [k] * 2000}, f)
    os.replace("ckpts/last.ckpt.tmp", "ckpts/last.ckpt")
