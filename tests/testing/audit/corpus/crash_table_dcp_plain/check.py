# dcp.load from the highest numbered ckpt/<step>/: exit non-zero when it cannot load.
import os
import pickle
import sys

top = os.path.join(sys.argv[1], "ckpt")
steps = [int(n) for n in os.listdir(top) if n.isdigit()] if os.path.isdir(top) else []
if steps:
    d = os.path.join(top, str(max(steps)))
    try:
        with open(os.path.join(d, ".metadata"), "rb") as f:
            meta = pickle.load(f)
        with open(os.path.join(d, "__0_0.distcp"), "rb") as f:
            assert f.read() == bytes([meta["k"]]) * meta["size"]
    except Exception as exc:
        sys.exit(f"cannot load {d}: {exc!r}")
