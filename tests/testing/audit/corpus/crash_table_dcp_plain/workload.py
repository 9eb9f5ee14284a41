# The crash table's dcp_plain row (benchmarks/crash_table/dcp_plain.py), its file pattern
# copied without torch: FileSystemWriter into ckpt/<step>/, the data file written and
# fsynced, then .metadata (the file a load needs) written last; three saves.
import os
import pickle

for step, k in ((10, 1), (20, 2), (30, 3)):
    d = os.path.join("ckpts", "ckpt", str(step))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "__0_0.distcp"), "wb") as f:
        f.write(bytes([k]) * 4096)
        os.fsync(f.fileno())
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump({"k": k, "size": 4096}, f)
        os.fsync(f.fileno())
