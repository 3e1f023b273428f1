"""Lets torchvision import next to the CPU torch==2.13.0 of this project's lerobot venvs (copied into their
site-packages by scripts/venvs/lerobot*.sh and run at start-up through a .pth line).

The torchvision wheels on PyPI are CUDA builds: their compiled ops (`torchvision/_C.so`) need libtorch_cuda and do not
load next to a CPU torch. torchvision then skips its ops, except for one unguarded fake-kernel registration of
`torchvision::nms`, which fails because the op was never defined, so `import torchvision` (and with it
`import lerobot.datasets`) fails. This hook defines that op's schema (no kernel: calling nms still fails, nothing the
dataset code needs) right before torchvision is first imported. It imports nothing until then.
"""
import importlib.abc
import sys


class _DefineNmsFirst(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: D102
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch
        try:
            torch.library.define("torchvision::nms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:
            pass  # already defined (the compiled ops did load)
        return None


if not any(isinstance(f, _DefineNmsFirst) for f in sys.meta_path):
    sys.meta_path.insert(0, _DefineNmsFirst())
