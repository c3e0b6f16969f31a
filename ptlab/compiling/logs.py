"""Compile-time logging: torch's compile loggers quieted for a block, Dynamo's warnings and its TORCH_LOGS
artifacts (graph_breaks, recompiles) routed to a list instead of stderr, and put back as they were afterwards."""
from __future__ import annotations

import contextlib
import logging

# Loggers that print compile-time notes to stderr (a missing CUDA runtime, a graph break from .item(),
# a recompile limit); quiet_compile_logs() silences them for the duration of a block only.
_NOISY_LOGGERS = ("torch._dynamo", "torch._inductor", "torch.utils.cpp_extension", "torch.fx.experimental")


@contextlib.contextmanager
def quiet_compile_logs(level: int = logging.ERROR):
    """Raise the level of torch's compile loggers inside the block; restore it afterwards."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, old in zip(loggers, before):
            lg.setLevel(old)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.first_lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        first = record.getMessage().strip().splitlines()[0] if record.getMessage().strip() else ""
        if first and first not in self.first_lines:
            self.first_lines.append(first)


@contextlib.contextmanager
def _dynamo_warnings_collected():
    """Inside the block, torch._dynamo's warnings go to a list instead of stderr; the other loggers stay quiet."""
    collect = _Collect()
    with quiet_compile_logs(), _routed([logging.getLogger("torch._dynamo")], collect, logging.WARNING):
        yield collect.first_lines


@contextlib.contextmanager
def _routed(loggers: list[logging.Logger], handler: logging.Handler, level: int):
    """Inside the block, the loggers send records from `level` up to `handler` alone; afterwards all is as it was."""
    saved = [(lg.level, lg.handlers[:], lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
        lg.handlers[:] = [handler]
        lg.propagate = False
    try:
        yield
    finally:
        for lg, (old_level, handlers, propagate) in zip(loggers, saved):
            lg.setLevel(old_level)
            lg.handlers[:] = handlers
            lg.propagate = propagate


_LOGGED = ("graph_breaks", "recompiles")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.name.rpartition(".__")[2], record.getMessage()))


@contextlib.contextmanager
def _artifacts_logged():
    """Inside the block, Dynamo's graph_breaks and recompiles logs go to a list; afterwards all is as it was."""
    import torch._dynamo  # noqa: F401  (its modules create the artifact loggers)
    from torch._logging import _internal

    loggers = [logging.getLogger(q) for q in _internal.log_registry.get_artifact_log_qnames()]
    loggers = [lg for lg in loggers if getattr(lg, "artifact_name", None) in _LOGGED]
    handler = _Records()
    added = set(_LOGGED) - _internal.log_state.artifact_names      # left enabled afterwards if TORCH_LOGS set them
    _internal.log_state.artifact_names.update(added)
    try:
        with _routed(loggers, handler, logging.DEBUG):
            yield handler.records
    finally:
        _internal.log_state.artifact_names.difference_update(added)
