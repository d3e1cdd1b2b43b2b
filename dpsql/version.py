"""The package's version: one place, importable by any layer without the package's API."""

__version__ = "0.1.0"
