"""Broken: never returns."""


def gelu(x):
    while True:
        pass
