"""Step factories for CLI tests of the ``module`` backend: whole "steps" that take real wall time.

``factory(G, V, K)`` returns a step that sleeps a fixed time growing with the verified tokens, so a
sweep over it runs on the real clock (the host timer), as a GPU sweep does, with a known cost per
visit: what its progress lines and ETA must agree with.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: Sleep per step: a base (``SLEEPY_BASE_S`` in the environment, seconds) plus a part per token.
BASE_S = float(os.environ.get("SLEEPY_BASE_S", "0.004"))
PER_TOKEN_S = 0.00005


def factory(g: int, v: int, k: int, **_: object) -> Callable[[], None]:
    """One cell's step: sleeps ``BASE_S + PER_TOKEN_S * tokens``."""
    tokens = g * (k + 1) if v == 0 else v
    seconds = BASE_S + PER_TOKEN_S * tokens

    def step() -> None:
        time.sleep(seconds)

    return step
