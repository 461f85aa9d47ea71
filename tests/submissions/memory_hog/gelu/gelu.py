"""Broken: tries to allocate 1 TB inside gelu."""
import torch


def gelu(x):
    hog = bytearray(1 << 40)
    return torch.empty_like(x) + len(hog)
