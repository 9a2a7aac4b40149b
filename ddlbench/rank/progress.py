"""The timed loop's progress bar (tqdm on rank 0): step, phase, loss, samples/s."""
from __future__ import annotations

import time


class Progress:
    """tqdm on rank 0: step, loss, samples/s. Refreshes at most ~4 times a second."""

    def __init__(self, enabled: bool, total: int, warmup: int, global_batch: int):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc="train", unit="step", mininterval=0.25, leave=True,
                            dynamic_ncols=True)
        self.warmup, self.global_batch, self._last = warmup, global_batch, 0.0

    def update(self, step: int, loss, step_s: float) -> None:
        if self.bar is None:
            return
        self.bar.update(1)
        now = time.monotonic()
        if now - self._last > 0.25 and loss is not None:
            self._last = now
            phase = "warmup" if step < self.warmup else "measure"
            self.bar.set_postfix(phase=phase, loss=f"{float(loss):.4f}",
                                 samples_s=f"{self.global_batch / step_s:.1f}", refresh=False)

    def note(self, **values) -> None:
        if self.bar is not None:
            self.bar.write("  ".join(f"{k}={v:.4f}" for k, v in values.items()))

    def resize(self, total: int, warmup: int | None = None) -> None:
        if warmup is not None:
            self.warmup = warmup
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
