"""The package version, in a leaf module so that modules writing it (the export marker, the CLI) need not import
the package facade (which imports the Database, which imports them lazily: a cycle)."""

__version__ = "0.2.0"  # keep equal to pyproject.toml [project] version
