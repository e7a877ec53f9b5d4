"""The version of layerprof, in one place (the package, the saved files and the CLI read it)."""
__version__ = "0.1.0"
