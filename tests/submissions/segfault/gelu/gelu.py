"""Broken: dereferences a null pointer inside gelu (SIGSEGV)."""
import ctypes


def gelu(x):
    return ctypes.string_at(0)
