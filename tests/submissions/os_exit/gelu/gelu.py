"""Broken: kills its own process from inside gelu."""
import os


def gelu(x):
    os._exit(3)
