# Exit non-zero when the state at argv[1] is unusable.
