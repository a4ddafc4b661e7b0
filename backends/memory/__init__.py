"""The in-process FoundationDB simulator: ``MemoryStore`` and its fault injection.

``memory://`` opens a fresh store; ``memory://name`` shares one store per process under
that name (for CLI demos). Query options: ``seed``, ``fault_not_committed``,
``fault_unknown_result``, ``fault_unknown_result_applied``, ``fault_too_old``, ``latency_ms``.
"""

from quickzones.backends.memory.faults import FAULT_KINDS, FaultConfig
from quickzones.backends.memory.store import MemoryStore, MemoryTransaction

__all__ = ["FAULT_KINDS", "FaultConfig", "MemoryStore", "MemoryTransaction"]
