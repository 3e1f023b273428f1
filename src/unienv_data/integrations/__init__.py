"""Adapters between unienv_data batches and other training stacks.

Nothing is imported here: import each integration explicitly (``from unienv_data.integrations.pytorch import
UniEnvAsPyTorchDataset``), so that ``import unienv_data`` never needs torch or any other optional library.
"""
