"""The concrete cases of a part outside pytest: the fixed examples plus ``n`` cases drawn from the
part's hypothesis strategy with a given seed (the grader mixes a secret into it), so a run is
reproducible for whoever knows the seed and unpredictable for whoever does not."""

from __future__ import annotations

import hashlib

from grader.checks.spec import Case, Part


def draw(part: Part, device: str, n: int, seed: int) -> list[Case]:
    """``n`` distinct random cases for ``part`` (fewer if the strategy runs dry)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    drawn: list[Case] = []
    if n <= 0:
        return drawn

    @hypothesis_seed(seed)
    @settings(
        max_examples=n,
        derandomize=False,  # a derandomizing profile (ci) would ignore the seed, and so the secret
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=part.cases(device))
    def collect(case):
        if part.skip(case, device) is None:
            drawn.append(case)

    collect()
    return drawn[:n]


def mixed_seed(secret: str, *public: object) -> int:
    """A 63-bit seed from a secret and public parts (exercise, part, case index, ...)."""
    text = "\x1f".join([secret, *map(str, public)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1
