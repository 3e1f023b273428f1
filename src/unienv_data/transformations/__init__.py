"""Data-layer transformations (registered for JSON, so a TransformedStorage using them reloads):
`image_compress.ImageCompressTransformation` (images as JPEG bytes in a fixed budget) and its inverse
`ImageDecompressTransformation`. Pillow is imported only when images are encoded or decoded."""
from .image_compress import ImageCompressTransformation, ImageDecompressTransformation

__all__ = ["ImageCompressTransformation", "ImageDecompressTransformation"]
