"""What a training run shows while it runs: the progress bar (steps, or the seconds of a time
budget) and the tokens-per-second window of the logged records."""

from __future__ import annotations

import time

from tqdm.auto import tqdm

__all__ = ["RunBar", "TokenRate"]


class RunBar:
    """The bar of one run: ``steps`` of a step-count run (from ``start``), or ``budget_s`` seconds of
    a time-budgeted one (from ``elapsed_s``, refreshed at most once a second). Disabled: silent,
    except :meth:`write` when ``echo``."""

    def __init__(self, *, enabled: bool, steps: int | None, start: int, budget_s: float | None = None,
                 elapsed_s: float = 0.0, echo: bool = True):
        self.timed, self.echo = budget_s is not None, enabled or echo
        if self.timed:
            total = round(budget_s)
            self.bar = tqdm(total=total, initial=min(round(elapsed_s), total), disable=not enabled, unit="s",
                            dynamic_ncols=True)
        else:
            self.bar = tqdm(total=steps, initial=start, disable=not enabled, unit="step", dynamic_ncols=True)

    def advance(self, elapsed_s: float) -> None:
        """One step done (``elapsed_s``: the training time so far)."""
        if not self.timed:
            self.bar.update(1)
            return
        second = min(int(elapsed_s), self.bar.total)
        if second > self.bar.n:
            self.bar.update(second - self.bar.n)

    def show(self, **figures) -> None:
        self.bar.set_postfix(**figures)

    def write(self, text: str) -> None:
        if self.echo:
            self.bar.write(text)

    def close(self) -> None:
        self.bar.close()


class TokenRate:
    """Tokens per second since the last :meth:`rate`."""

    def __init__(self):
        self.tokens, self.t0 = 0.0, time.perf_counter()

    def add(self, tokens: float) -> None:
        self.tokens += tokens

    def rate(self) -> float:
        now = time.perf_counter()
        out = self.tokens / max(now - self.t0, 1e-9)
        self.tokens, self.t0 = 0.0, now
        return out
