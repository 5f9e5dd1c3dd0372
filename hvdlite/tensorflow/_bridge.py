"""The seam between TensorFlow tensors and the numpy-level hvdlite engine.

Every TensorFlow collective in this package is a numpy function run twice over:

* eagerly, it is called at once on zero-copy numpy views of the tensors and the
  engine's arrays are turned back into tensors;
* inside a ``tf.function`` (including Keras' ``model.fit`` train step), it
  becomes one stateful ``tf.numpy_function`` node whose outputs get the static
  shapes known at trace time.  ``tf.function`` chains stateful nodes in program
  order, so every rank runs its collectives in the order the code wrote them.

Cross-rank contract: the engine pairs collectives across ranks by name.  Eagerly,
an unnamed op takes the engine's per-op counter (ranks must call in the same
order, as in Horovod).  In a graph, an unnamed op gets a name fixed at trace
time from a per-graph count of collectives (see :func:`op_name`), so every rank
names its collectives identically however often the graph runs.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from hvdlite import basics as _basics
from hvdlite import ops as _ops
from hvdlite import process_sets as _process_sets
from hvdlite import runtime as _runtime

__all__ = [
    "SUPPORTED_DTYPES",
    "check_dtype",
    "check_process_set",
    "op_name",
    "normalize_name",
    "run",
    "to_wire",
    "from_wire",
    "process_set_by_id",
]

#: TensorFlow dtypes the collectives accept.  bfloat16 is an hvdlite extension:
#: numpy has no bfloat16, so it is reduced in float32 and moved bit-exactly as int16.
SUPPORTED_DTYPES = frozenset({
    tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64,
    tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.bool,
})

def check_dtype(dtype: tf.DType, what: str, *, op=None) -> None:
    """Raise ValueError at call time for a dtype the engine cannot carry.

    ``op``: the reduction, for reductions (bool reduces only with Min/Max/Product).
    """
    allowed = SUPPORTED_DTYPES
    if dtype not in allowed:
        names = ", ".join(sorted(d.name for d in allowed))
        raise ValueError(
            f"hvdlite {what} does not support tensors of dtype {dtype.name}; "
            f"supported: {names}. Cast the tensor first."
        )
    if op is not None and dtype == tf.bool and op not in (_ops.Min, _ops.Max,
                                                         _ops.Product):
        raise ValueError(
            f"hvdlite {what}: a bool tensor can only be reduced with op=Min (and), Max (or) "
            "or Product (and); cast it to an integer type to sum or average."
        )


def check_process_set(process_set, what: str) -> None:
    """Fail at call time (not deep inside a graph run) for a set this rank is not in."""
    if not process_set.included():
        raise ValueError(
            f"hvdlite {what}: this rank ({_basics.rank()}) is not a member of "
            f"process set {process_set.ranks}; only its members may call collectives on it."
        )


def normalize_name(name: str) -> str:
    """TensorFlow op-name rules: keep [A-Za-z0-9_], replace the rest with '_'."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def op_name(kind: str, tensors: Sequence, name: str | None,
            ignore_name_scope: bool = False) -> str | None:
    """The engine name for one collective, fixed at trace time in a graph.

    Eagerly the user's name is passed through (None: the engine's counter).
    In a graph, an unnamed collective is called ``Horovod<kind>_<k>`` where k
    counts this graph's collectives of that kind in creation order: the same
    on every rank, because ranks must create their collectives in the same
    order anyway, and unaffected by rank-dependent ordinary ops (whose tensor
    names would shift).  A user's name gets the current name scope (unless
    ``ignore_name_scope``) and a ``_<k>`` suffix when the graph reuses it.
    Names repeat across graphs and across runs of one graph: the engine's
    response cache then recognises them.
    """
    if tf.executing_eagerly():
        return name
    graph = tf.compat.v1.get_default_graph()
    used = _GRAPH_NAMES.get(graph)
    if used is None:
        used = _GRAPH_NAMES[graph] = {}
    if name is None:
        base = f"Horovod{kind}"
    else:
        scope = "" if ignore_name_scope else graph.get_name_scope()
        base = f"{scope}/{name}" if scope else name
    k = used.get(base, 0)
    used[base] = k + 1
    if name is None:
        return f"{base}_{k}"
    return base if k == 0 else f"{base}_{k}"


_GRAPH_NAMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def to_wire(tensor: tf.Tensor, *, reduce: bool) -> tf.Tensor:
    """bfloat16 and float16 are reduced as float32 (cast by TensorFlow: numpy has no
    bfloat16, and its float16 casts are far slower for small values); bfloat16
    moves bit-exactly as int16 otherwise."""
    if tensor.dtype == tf.float16:
        return tf.cast(tensor, tf.float32) if reduce else tensor
    if tensor.dtype != tf.bfloat16:
        return tensor
    return tf.cast(tensor, tf.float32) if reduce else tf.bitcast(tensor, tf.int16)


def from_wire(tensor: tf.Tensor, dtype: tf.DType, *, reduce: bool) -> tf.Tensor:
    """Undo :func:`to_wire`."""
    if dtype == tf.float16:
        return tf.cast(tensor, tf.float16) if reduce else tensor
    if dtype != tf.bfloat16:
        return tensor
    return tf.cast(tensor, tf.bfloat16) if reduce else tf.bitcast(tensor, tf.bfloat16)


def _as_array(value) -> np.ndarray:
    array = np.asarray(value)  # zero-copy view of an eager CPU tensor
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def run(fn: Callable[..., Sequence[np.ndarray]], inputs: Sequence[tf.Tensor],
        out_dtypes: Sequence[tf.DType], out_shapes: Sequence, name: str | None = None,
        *, outputs_like_inputs: int = 0) -> list[tf.Tensor]:
    """Run ``fn(*arrays, outputs=...) -> arrays`` on tensors, eagerly or as one graph node.

    ``fn`` receives C-contiguous numpy arrays and must return arrays of exactly
    ``out_dtypes``.  In a graph the outputs get ``out_shapes`` (None entries
    for unknown dimensions).  Exceptions raised by ``fn`` propagate unchanged
    eagerly; in a graph TensorFlow re-raises them as ``tf.errors.OpError``
    carrying the original message.

    ``outputs_like_inputs=k`` says the first k outputs have the shapes and
    dtypes of the first k inputs.  In a graph, ``fn`` then gets
    ``outputs=[k arrays]`` to write into: buffers owned by this graph node and
    reused every run (TensorFlow copies what a numpy function returns, so
    reuse is safe), which spares a fresh allocation per step.  Eagerly, and
    when k is 0, ``outputs`` is None.
    """
    inputs = list(inputs)
    if tf.executing_eagerly():
        outs = fn(*[_as_array(x) for x in inputs], outputs=None)
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, out_dtypes, strict=True)]

    if _in_xla_context():
        raise ValueError(
            "hvdlite collectives cannot run inside an XLA-compiled function (jit_compile=True): "
            "they call into Python.  Use jit_compile=False, e.g. "
            "model.compile(..., jit_compile=False) or tf.function(jit_compile=False).")
    reused: list[np.ndarray] = []

    def graph_fn(*arrays):
        arrays = [_as_array(a) for a in arrays]
        outputs = None
        if outputs_like_inputs:
            like = arrays[:outputs_like_inputs]
            if len(reused) != len(like) or any(
                    b.shape != a.shape or b.dtype != a.dtype
                    for b, a in zip(reused, like, strict=True)):
                reused[:] = [np.empty_like(a) for a in like]
            outputs = list(reused)
        outs = fn(*arrays, outputs=outputs)
        return [np.asarray(o, dtype=d.as_numpy_dtype)
                for o, d in zip(outs, out_dtypes, strict=True)]

    op = None if name is None else normalize_name(name.rsplit("/", 1)[-1])[:120] or None
    outs = tf.numpy_function(graph_fn, inputs, list(out_dtypes), stateful=True, name=op)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    outs = list(outs)
    for out, shape in zip(outs, out_shapes, strict=True):
        out.set_shape(shape)
    return outs


def _in_xla_context() -> bool:
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - private module moved
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


# --- process sets by id (for the graph-time size_op / rank_op family) --------


def process_set_by_id(process_set_id: int):
    """The registered ProcessSet with this id, from the running job's registry
    (ValueError when there is none)."""
    if process_set_id == 0:
        return _process_sets.global_process_set
    found = _runtime.state().sets.get(int(process_set_id))
    if found is None:
        raise ValueError(
            f"hvdlite: no process set with id {process_set_id} is registered; register it "
            "with hvd.init(process_sets=[...]) or hvd.add_process_set() first."
        )
    return found
