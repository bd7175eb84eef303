"""Deprecated: `vitzoo.fast` is now `vitzoo.inference` (beside `vitzoo.fastest` the old name said
neither what it holds nor how the two differ). Every name it had still works from here, with a
FutureWarning at import; `inference_dtype(device)` is `vitzoo.precision.half_of(device)`."""

from __future__ import annotations

import warnings

from vitzoo.inference import (  # noqa: F401  (the names `vitzoo.fast` offered)
    COMPILE_CACHE,
    COMPILE_MUST_BE,
    INFERENCE_DTYPES,
    Inference,
    compile_for_inference,
    compile_for_training,
    compile_key,
    for_inference,
)
from vitzoo.precision import half_of as inference_dtype  # noqa: F401

warnings.warn("vitzoo.fast is renamed vitzoo.inference (vitzoo.inference.for_inference(model)); vitzoo.fast will be removed",
              FutureWarning, stacklevel=2)
