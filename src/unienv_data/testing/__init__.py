"""The `SpaceStorage` contract as a reusable test kit.

`StorageConformance` is a mixin of pytest test methods that every storage in this package passes; subclass it
with a few hooks (`make_space`, `create`, `load`) to test a storage of your own; its `test_state_machine` runs
the Hypothesis state machine of `unienv_data.testing.state_machine` through the same hooks (docs/testing.md). Importing this package needs
`pytest` and `hypothesis` (the `testing` extra); importing `unienv_data` itself does not.
"""
from unienv_data.testing.conformance import (
    INDEX_ERRORS,
    STATE_ERRORS,
    STRUCTURE_ERRORS,
    VALUE_ERRORS,
    StorageConformance,
    assert_tree_equal,
    expect_error,
    sample_from_space,
    stack_tree,
)
from unienv_data.testing.state_machine import (
    StorageModel,
    StorageStateMachine,
    run_storage_state_machine,
    storage_state_machine,
)

__all__ = [
    "INDEX_ERRORS",
    "STATE_ERRORS",
    "STRUCTURE_ERRORS",
    "VALUE_ERRORS",
    "StorageConformance",
    "assert_tree_equal",
    "expect_error",
    "sample_from_space",
    "stack_tree",
    "StorageModel",
    "StorageStateMachine",
    "run_storage_state_machine",
    "storage_state_machine",
]
