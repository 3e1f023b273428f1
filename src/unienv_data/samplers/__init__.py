"""Samplers that draw training batches from a batch or replay buffer."""
from .multiprocessing_sampler import MultiprocessingSampler, SamplerWorkerError
from .prioritized import PrioritizedSampler, SumTree
from .segment_sampler import SegmentSampler
from .slice_sampler import SliceSampler
from .step_sampler import StepSampler

__all__ = ["StepSampler", "SliceSampler", "SegmentSampler", "PrioritizedSampler", "SumTree", "MultiprocessingSampler",
           "SamplerWorkerError"]
