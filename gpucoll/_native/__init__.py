"""Compiled transports (built from cython_src/)."""
