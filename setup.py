"""Minimal shim for tools that still call setup.py; the configuration lives in pyproject.toml."""
from setuptools import setup

setup()
