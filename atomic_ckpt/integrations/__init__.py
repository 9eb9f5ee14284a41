"""Integrations with training frameworks, one module per framework, each behind its own extra."""
