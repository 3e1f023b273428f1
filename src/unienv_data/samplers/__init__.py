"""Samplers that draw training batches from a batch or replay buffer."""
from .step_sampler import StepSampler

__all__ = ["StepSampler"]
