"""A quiet start: third-party log lines that do not concern the user's run (a library telling
another library about a deprecation) are kept off the terminal, by message, and kept in the run's
directory instead (<run>/third_party.log; each rank appends what it kept). Anything not listed here
still reaches the terminal."""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

# (logger, a part of the message): what is filtered, and nothing else
NOT_ABOUT_YOUR_RUN = (
    # torchao registers its Enums with torch's pytree at import; torch 2.14 deprecates that (torchao's
    # business, not the run's): printed once per process that imports transformers with torchao installed
    ("torch.utils._pytree", "is an Enum subclass and is now natively supported"),
    # DeepSpeed's import on a CPU-only machine looks for CUDA and says it found none: a CPU run needs none
    ("torch.utils.cpp_extension", "No CUDA runtime is found"),
)
# (warning category, a part of the message): Python warnings of the same kind
WARNINGS_NOT_ABOUT_YOUR_RUN = (
    # FSDP2 and DeepSpeed call torch's c10d functions torch 2.14 deprecates: the libraries' business
    (FutureWarning, "is deprecated. Please use `torch.distributed."),
)
_kept: list[str] = []
_show_original = None


class _Keep(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for name, text in NOT_ABOUT_YOUR_RUN:
            if record.name == name and text in message:
                _kept.append(f"{record.levelname} {record.name}: {message}")
                return False
        return True


_FILTER = _Keep()


def _show(message, category, filename, lineno, file=None, line=None):
    text = str(message)
    if any(issubclass(category, kind) and part in text for kind, part in WARNINGS_NOT_ABOUT_YOUR_RUN):
        _kept.append(f"{category.__name__} {filename}:{lineno}: {text}")
        return
    _show_original(message, category, filename, lineno, file, line)


def install() -> None:
    """Filter the listed messages in this process (and the processes it forks)."""
    global _show_original
    for name, _ in NOT_ABOUT_YOUR_RUN:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    if warnings.showwarning is not _show:
        _show_original = warnings.showwarning
        warnings.showwarning = _show


def kept() -> list[str]:
    return list(_kept)


def write_kept(path: Path) -> None:
    """Append what was kept off the terminal to the run's log of it (nothing kept: no file)."""
    if _kept and Path(path).parent.is_dir():
        with open(path, "a") as f:
            f.write("\n".join(_kept) + "\n")
        _kept.clear()
