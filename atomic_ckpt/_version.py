"""The version of atomic_ckpt, read by the build (hatch) and by ``atomic_ckpt.__version__``."""

__version__ = "0.2.0"
