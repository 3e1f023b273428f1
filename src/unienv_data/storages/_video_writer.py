"""`VideoSegmentWriter`, the segment writer of `VideoStorage`: appended frames are encoded at once into a hidden
temporary file of the storage directory (nothing is buffered in memory); `commit(start)` finishes the file (phase one,
`prepare_commit`), then hands it to the storage, which renames it into place and records it (phase two); `abort()`
deletes it. A rolled-back prepare keeps the finished file, so the writer can be committed again.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from unienv_data.base.errors import StorageStateError
from unienv_data.base.segment_writer import SegmentWriter

from ._video_codec import EncodedFile, FrameEncoder, remove_quietly

if TYPE_CHECKING:
    from .video_storage import VideoStorage


class VideoSegmentWriter(SegmentWriter):
    """Encodes appended frames straight into a hidden temporary file; `commit(start)` renames it into place and
    records it, `abort()` deletes it. Many writers may be open at once (each has its own file)."""

    def __init__(self, storage: "VideoStorage") -> None:
        super().__init__(storage)
        self._vs = storage
        self._encoder: Optional[FrameEncoder] = None
        self._encoded: Optional[EncodedFile] = None     # finished by a prepare, not yet placed
        self._lost = False

    def _append(self, value: Any) -> None:
        vs = self._vs
        vs.check_writable()
        arr = vs._conv.convert_single(value)
        if self._encoder is None:
            if self._lost:
                raise StorageStateError("this writer's frames were lost in a failed commit; abort it")
            self._encoder = vs._new_encoder()
        self._encoder.add(arr)

    def _prepare(self, start: int) -> None:
        if self._encoded is not None:           # finished by an earlier prepare that was rolled back
            return
        if self._length and self._encoder is None:
            raise StorageStateError("this writer's frames were lost in a failed commit or when its storage was "
                                    "closed; abort it")
        self._encoded = self._vs._finish_encoder(self._encoder, start, self._length, self._forget_encoder)
        if self._encoded is not None:
            self._lost = False                  # the frames live on in the finished file

    def _publish(self, start: int) -> None:
        encoded, self._encoded = self._encoded, None
        if encoded is not None:
            self._lost = True                   # the storage owns the file now (placed, or deleted on an error)
            self._vs._install_encoded(encoded, start, self._length)

    def _commit(self, start: int) -> None:
        self._prepare(start)
        self._publish(start)

    def _forget_encoder(self) -> None:
        """Called once the encoder's file is finished (committed or failed): it no longer belongs to the writer."""
        self._encoder = None
        self._lost = True

    def _release_rows(self) -> None:
        self._drop()

    def _drop(self) -> None:
        if self._encoded is not None:
            remove_quietly(self._encoded.path)
            self._encoded = None
            self._lost = True
        if self._encoder is not None:
            self._encoder.discard()
            self._encoder = None
            self._lost = True

    def __del__(self) -> None:
        try:
            self._drop()
        except Exception:  # noqa: BLE001
            pass


__all__ = ["VideoSegmentWriter"]
