"""Broken: a syntax error (an unclosed parenthesis)."""
import torch


def gelu(x):
    return torch.empty_like(x

