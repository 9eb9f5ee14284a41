"""The ``atomic-ckpt demo`` runs: a killed save, then a clean resume."""
