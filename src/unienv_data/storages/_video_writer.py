"""`VideoSegmentWriter`, the segment writer of `VideoStorage`: appended frames are encoded at once into a hidden
temporary file of the storage directory (nothing is buffered in memory); `commit(start)` finishes the file (phase one,
`prepare_commit`), then hands it to the storage, which renames it into place and records it (phase two); `abort()`
deletes it. A rolled-back prepare keeps the finished file, so the writer can be committed again.

The storage hands the writer what it needs when it opens it (`VideoStorageHooks`: its write check, frame conversion,
new encoders, and the two phases of placing a file), and closes it through `discard_files`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

from unienv_data.base.errors import StorageStateError
from unienv_data.base.segment_writer import SegmentWriter

from ._video_codec import EncodedFile, FrameEncoder, remove_quietly

if TYPE_CHECKING:
    from .video_storage import VideoStorage


class VideoStorageHooks(NamedTuple):
    """What a `VideoSegmentWriter` uses of its storage (given by `VideoStorage.open_segment_writer`)."""

    #: raises when the storage is closed or read-only
    check_writable: Callable[[], None]
    #: one frame, checked and converted to the storage's NumPy dtype and shape
    convert: Callable[[Any], Any]
    #: a new encoder writing a hidden temporary file of the storage directory
    new_encoder: Callable[[], FrameEncoder]
    #: phase one of a commit: `finish(encoder, start, length, on_finished)` finishes the file (None: no frames)
    finish: Callable[..., Optional[EncodedFile]]
    #: phase two: `install(encoded, start, length)` renames the finished file into place and records the segment
    install: Callable[[EncodedFile, int, int], None]


class VideoSegmentWriter(SegmentWriter):
    """Encodes appended frames straight into a hidden temporary file; `commit(start)` renames it into place and
    records it, `abort()` deletes it. Many writers may be open at once (each has its own file)."""

    def __init__(self, storage: "VideoStorage", hooks: VideoStorageHooks) -> None:
        super().__init__(storage)
        self._hooks = hooks
        self._encoder: Optional[FrameEncoder] = None
        self._encoded: Optional[EncodedFile] = None     # finished by a prepare, not yet placed
        self._lost = False

    def _append(self, value: Any) -> None:
        hooks = self._hooks
        hooks.check_writable()
        arr = hooks.convert(value)
        if self._encoder is None:
            if self._lost:
                raise StorageStateError("this writer's frames were lost in a failed commit; abort it")
            self._encoder = hooks.new_encoder()
        self._encoder.add(arr)

    def _prepare(self, start: int) -> None:
        if self._encoded is not None:           # finished by an earlier prepare that was rolled back
            return
        if self._length and self._encoder is None:
            raise StorageStateError("this writer's frames were lost in a failed commit or when its storage was "
                                    "closed; abort it")
        self._encoded = self._hooks.finish(self._encoder, start, self._length, self._forget_encoder)
        if self._encoded is not None:
            self._lost = False                  # the frames live on in the finished file

    def _publish(self, start: int) -> None:
        encoded, self._encoded = self._encoded, None
        if encoded is not None:
            self._lost = True                   # the storage owns the file now (placed, or deleted on an error)
            self._hooks.install(encoded, start, self._length)

    def _commit(self, start: int) -> None:
        self._prepare(start)
        self._publish(start)

    def _forget_encoder(self) -> None:
        """Called once the encoder's file is finished (committed or failed): it no longer belongs to the writer."""
        self._encoder = None
        self._lost = True

    @property
    def temporary_path(self) -> Optional[str]:
        """The hidden temporary file this writer is encoding into (None before its first frame and once finished)."""
        return self._encoder.path if self._encoder is not None else None

    def _release_rows(self) -> None:
        self.discard_files()

    def discard_files(self) -> None:
        """Deletes this writer's temporary or finished file (its storage is closing); a later commit raises."""
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
            self.discard_files()
        except Exception:  # noqa: BLE001
            pass


__all__ = ["VideoSegmentWriter", "VideoStorageHooks"]
