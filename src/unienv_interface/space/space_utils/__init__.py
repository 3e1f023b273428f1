"""Space utilities: batching, flattening and JSON serialization.

The modules' functions are also importable from here (`from unienv_interface.space.space_utils import
flatten_data`), as in unienv 0.0.1b16."""
from . import batch_utils, flatten_utils, serialization_utils
from .batch_utils import *  # noqa: F401,F403
from .batch_utils import __all__ as _batch_names
from .flatten_utils import *  # noqa: F401,F403
from .flatten_utils import __all__ as _flatten_names
from .serialization_utils import *  # noqa: F401,F403
from .serialization_utils import __all__ as _serialization_names

__all__ = ["batch_utils", "flatten_utils", "serialization_utils", *_batch_names, *_flatten_names,
           *_serialization_names]
