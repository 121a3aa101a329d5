"""The package version, importable from every layer (setup.py reads it too)."""

__version__ = "0.1.0"
