"""Results as JSON: the one conversion every report, CLI and study record goes through."""

import math

import numpy as np


def to_jsonable(obj, nonfinite_as_string=False):
    """NamedTuples -> dicts, arrays (numpy or JAX) and numpy scalars -> lists and numbers,
    tuples -> lists, recursively. Non-finite floats stay floats (so json.dumps(allow_nan=False)
    catches a NaN that should not be there) unless nonfinite_as_string: then 'inf', '-inf',
    'nan', for records where an infinity is a legitimate answer (a budget no estimate reaches)."""
    convert = lambda value: to_jsonable(value, nonfinite_as_string)
    if hasattr(obj, "_asdict"):
        return {k: convert(v) for k, v in obj._asdict().items()}
    if isinstance(obj, dict):
        return {str(k): convert(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [convert(v) for v in obj]
    if isinstance(obj, np.generic) or hasattr(obj, "__array__"):
        return convert(np.asarray(obj).tolist())
    if nonfinite_as_string and isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj
