"""Exercise specs, checks and tooling for the Triton kernel programming course."""

__version__ = "0.1.0"
