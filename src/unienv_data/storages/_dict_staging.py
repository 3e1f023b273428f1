"""Check everything, then write: how `DictStorage` stages one sample (or batch) across its children.

A write goes in two phases. First the whole value is checked: its dict structure (`StructureCheck`), then every
child's part through the child's staging protocol (`SpaceStorage.stage_set` / `stage_append` / `open_staged_writer`),
which checks without writing and hands back the write. Only when every child accepted its part are the writes run.
Children whose staging cannot check everything (`staging_checks_all` False: storages on the `SpaceStorage`
defaults) are staged and written first, so if one of them refuses after all no other child was touched.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, FrozenSet, Iterator, List, Sequence, Tuple

import numpy as np

from unienv_data.base.errors import StorageStateError
from unienv_data.base.segment_writer import SegmentWriter
from unienv_data.base.storage import SpaceStorage
from unienv_data.base.values import key_set_error
from unienv_interface.space import DictSpace, Space

from ._dict_routing import Path, join_path

if TYPE_CHECKING:
    from .dict_storage import DictStorage

Commit = Callable[[], None]
Extract = Callable[[Any], Any]


def run_all(commits: Sequence[Commit]) -> None:
    for commit in commits:
        commit()


def write_order(children: Sequence[SpaceStorage]) -> List[int]:
    """Child indices in staging / writing order: children that may still refuse a value when written come first."""
    unsure = [i for i, c in enumerate(children) if not c.staging_checks_all]
    return unsure + [i for i in range(len(children)) if i not in unsure]


@contextlib.contextmanager
def children_commit(children: Sequence[SpaceStorage]) -> Iterator[None]:
    """Holds the children's own per-commit persistence back for the block: their owner persists them together
    afterwards (its `on_segment_committed`), so one commit point covers every child."""
    kept = [c.durable for c in children]
    if not any(kept):       # nothing to hold back (a non-durable storage, a shared buffer's)
        yield
        return
    for c in children:
        c.durable = False
    try:
        yield
    finally:
        for c, d in zip(children, kept):
            c.durable = d


def copy_tree(value: Any) -> Any:
    """A snapshot of a (nested) sample: dicts rebuilt, NumPy arrays and tensors copied."""
    if isinstance(value, Mapping):
        return {k: copy_tree(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.copy()
    clone = getattr(value, "clone", None)
    return clone() if callable(clone) else value


class StructureCheck:
    """Checks that a value has exactly the dict structure of a `DictSpace` (before any child sees it): KeyError
    naming missing / extra keys, TypeError where a dict was expected."""

    def __init__(self, space: Space, sep: str) -> None:
        self.sep = sep
        self.dict_nodes: List[Tuple[Path, FrozenSet[Any]]] = []

        def nodes(node: Space, path: Path) -> None:
            if isinstance(node, DictSpace):
                self.dict_nodes.append((path, frozenset(node.spaces)))
                for k, child in node.spaces.items():
                    nodes(child, path + (k,))
        nodes(space, ())
        self.root_keys = self.dict_nodes[0][1]
        self.flat = all(len(p) == 0 for p, _ in self.dict_nodes)

    def check(self, value: Any) -> None:
        if self.flat:
            if type(value) is not dict and not isinstance(value, Mapping):
                raise TypeError(f"expected a dict with keys {sorted(self.root_keys)}, got {type(value).__name__}")
            if value.keys() != self.root_keys:
                self._key_error(value, (), self.root_keys)
            return
        for path, keyset in self.dict_nodes:
            v = value
            for p in path:
                v = v[p]
            if not isinstance(v, Mapping):
                where = f" at {join_path(path, self.sep)!r}" if path else ""
                raise TypeError(f"expected a dict{where} with keys {sorted(keyset)}, got {type(v).__name__}")
            if v.keys() != keyset:
                self._key_error(v, path, keyset)

    def _key_error(self, value: Mapping, path: Path, expected: FrozenSet[Any]) -> None:
        at = f" under {join_path(path, self.sep)!r}" if path else ""
        raise key_set_error(value.keys(), expected, at)


class Stager:
    """The staging plan of one `DictStorage` (`owner`): its children in write order, each with the extractor of its
    part of a sample, and the structure check that comes before them."""

    def __init__(self, owner: "DictStorage", children: Sequence[SpaceStorage], extractors: Sequence[Extract],
                 check: Callable[[Any], None]) -> None:
        self.owner = owner
        #: children opened read-only stay read-only (checked again by each child on write)
        self.all_mutable = all(c.is_mutable for c in children)
        order = write_order(children)
        self.parts: List[Tuple[SpaceStorage, Extract]] = [(children[i], extractors[i]) for i in order]
        self.check = check

    def stage_set(self, index: Any, value: Any) -> Commit:
        """Checks a value for `set(index, ...)` in every child; returns the writes (run in write order)."""
        self.check(value)
        return partial(run_all, [child.stage_set(index, extract(value)) for child, extract in self.parts])

    def stage_append(self, value: Any) -> List[Commit]:
        """Checks one sample for `append` in every child (state included); returns the appends."""
        owner = self.owner
        if owner.is_closed or not self.all_mutable:
            owner.check_writable()
        try:
            self.check(value)
            return [child.stage_append(extract(value)) for child, extract in self.parts]
        except StorageStateError:
            owner.check_append_state()  # the same error named after the owner (or its children disagree)
            raise

    def prepare_single(self, value: Any) -> Any:
        """Checks one sample for every child's writer hook (no segment state involved); returns a snapshot."""
        self.check(value)
        for child, extract in self.parts:
            child.check_value(extract(value))
        return copy_tree(value)


class DictSegmentWriter(SegmentWriter):
    """One staged writer per child (`open_staged_writer`); an append checks the whole sample before any child writer
    buffers it, `commit(start)` commits every child at `start`."""

    def __init__(self, storage: SpaceStorage, stager: Stager) -> None:
        super().__init__(storage)
        staged = [child.open_staged_writer() for child, _extract in stager.parts]
        self.writers: List[SegmentWriter] = [w for w, _stage in staged]
        self._stages = [(stage, extract) for (_w, stage), (_c, extract) in zip(staged, stager.parts)]
        self._check = stager.check

    def _stage_parts(self, value: Any) -> List[Commit]:
        self._check(value)
        return [stage(extract(value)) for stage, extract in self._stages]

    def stage(self, value: Any) -> Commit:
        """Checks one sample for every child writer (nothing is buffered on error); returns the append."""
        if self.is_finished:
            raise StorageStateError(f"Cannot append to a {self.state} segment writer")
        return partial(self._push, self._stage_parts(value))

    def _push(self, commits: List[Commit]) -> None:
        run_all(commits)
        self._length += 1

    def _append(self, value: Any) -> None:
        run_all(self._stage_parts(value))

    def finish(self) -> None:
        super().finish()
        for w in self.writers:
            w.finish()

    def _prepare(self, start: int) -> None:
        """Phase one in every child (rows written, files finished, nothing recorded); when one child fails, every
        child prepared so far (and the failing one) is rolled back and the children again agree on their segments
        (rows a ring commit overwrote leave their old segments in every child, not only in some)."""
        prepared: List[SegmentWriter] = []
        try:
            for w in self.writers:
                w.prepare_commit(start)
                prepared.append(w)
        except BaseException:
            for w in reversed(prepared):
                w.rollback_commit()
            if self._length:
                for c in self.storage.child_storages():
                    c.forget_segments(start, self._length)
            raise

    def _publish(self, start: int) -> None:
        """Phase two: every child records the segment with per-child durability held back, then the owner's one
        commit point persists them together. A child failing to publish un-publishes the children before it."""
        owner: "DictStorage" = self.storage  # type: ignore[assignment]   # a DictSegmentWriter's storage
        published: List[SegmentWriter] = []
        try:
            with children_commit(owner.child_storages()):
                for w in self.writers:
                    w.publish_commit(release=False)
                    published.append(w)
            owner.on_segment_committed()
        except BaseException:
            for w in reversed(self.writers):
                w.rollback_commit(published=w in published)
            raise
        for w in self.writers:
            w.finish_commit()

    def _rollback_prepare(self, start: int) -> None:
        for w in self.writers:
            w.rollback_commit()

    def _commit(self, start: int) -> None:
        self._prepare(start)
        self._publish(start)

    def abort(self) -> None:
        super().abort()
        for w in self.writers:
            if w.state != "committed":
                w.abort()


__all__ = ["Commit", "run_all", "write_order", "children_commit", "copy_tree", "StructureCheck", "Stager",
           "DictSegmentWriter"]
