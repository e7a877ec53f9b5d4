"""The benchmark scripts (run as ``python benchmarks/NAME.py``); a package, so that the tests import them from here
and not from a top-level ``benchmarks`` package another distribution installs (opacus has one)."""
