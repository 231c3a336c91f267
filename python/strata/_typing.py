"""Type aliases the package's modules share."""
from __future__ import annotations

import os
from typing import Union

# A filesystem path as the package's functions take it: a str or an os.PathLike (pathlib.Path). The quotes keep
# os.PathLike unsubscripted at run time, which Python 3.8 requires.
StrPath = Union[str, "os.PathLike[str]"]
