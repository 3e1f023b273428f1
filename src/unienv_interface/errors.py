"""Warning types shared by the interface package and the data package (which re-exports them from
`unienv_data.base.errors`): they live here because the interface package never imports the data package."""
from __future__ import annotations


class BoundsWarning(UserWarning, ValueError):
    """A value lies outside its Box's declared `[low, high]` (NaN in a bounded float Box included). It was kept all
    the same, as unienv 0.0.1b16 and gymnasium do: a storage stores it as given, a transformation maps it as the
    reference does (a rescale extrapolates). Issued once per key and storage, or once per transformation;
    `warnings.simplefilter("error", BoundsWarning)` turns it into a refusal: the write then changes nothing, and what
    it raises is also a `ValueError` (the error any other refused value raises), so code that catches ValueError
    keeps working."""


__all__ = ["BoundsWarning"]
