"""The client's sampler: `protocol.sampling` (shared with the ring loop and the verifiers)."""

from protocol.sampling import SamplingConfig, descending_order, sample

__all__ = ["SamplingConfig", "descending_order", "sample"]
