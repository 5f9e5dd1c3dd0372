"""The seam between TensorFlow tensors and the numpy-level hvdlite engine.

Every TensorFlow collective in this package is a numpy function run twice over:

* eagerly, it is called at once on zero-copy numpy views of the tensors and the
  engine's arrays are turned back into tensors;
* inside a graph (a ``tf.function``, Keras' ``model.fit`` train step, or a
  ``tf.compat.v1`` graph run by a ``Session``), it becomes one stateful
  ``tf.numpy_function`` node whose outputs get the static shapes known at trace
  time.

Order in a graph.  Each node blocks its TensorFlow thread until the
collective is done, so two ranks that run two independent collectives in
opposite orders would wait for each other forever.  The collectives of one
graph are therefore chained, in creation order, by control dependencies (see
:func:`chain_link`): every rank builds the same graph, so every rank runs them in
the same order.  ``tf.function`` orders stateful nodes in program order
anyway; in a ``tf.compat.v1`` graph the chain is what orders them, and running
a collective there also runs the collectives created before it in the same
graph (the helpers meant to be run on their own, such as
``broadcast_global_variables``, stay out of the chain).  Code that builds
collectives inside a ``tf.cond`` makes the cond one link of the chain with
:func:`chain_link`.

Outputs in a graph.  TensorFlow adopts an array a numpy function returns as
the output tensor's memory, without a copy, where the array's data is aligned
to 64 bytes, and copies it otherwise.  So a node never returns memory it
writes again: its outputs are fresh arrays every run (:func:`fresh_output`,
aligned, so TensorFlow takes them as they are), never buffers kept from run
to run, which a tensor of an earlier run would still be reading.

Errors.  Eagerly the engine's errors come out under Horovod's TensorFlow
classes (see :mod:`hvdlite.tensorflow._errors`); in a graph a mismatch leaves
the node as an extra output and fails the run with FailedPreconditionError
before any output is used.

Cross-rank contract: the engine pairs collectives across ranks by name.  Eagerly,
an unnamed op takes the engine's per-op counter (ranks must call in the same
order, as in Horovod).  In a graph, an unnamed op gets a name fixed at trace
time from a per-graph count of collectives (see :func:`op_name`), so every rank
names its collectives identically however often the graph runs.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from hvdlite import basics as _basics
from hvdlite import ops as _ops
from hvdlite import process_sets as _process_sets
from hvdlite.exceptions import HorovodInternalError

from . import _device, _errors

__all__ = [
    "SUPPORTED_DTYPES",
    "check_dtype",
    "check_process_set",
    "fresh_output",
    "op_name",
    "normalize_name",
    "run",
    "chain_link",
    "to_wire",
    "from_wire",
    "Scaling",
    "process_set_by_id",
]

#: TensorFlow dtypes the collectives accept.  bfloat16 is an hvdlite extension:
#: reduced in float32 (as it is where it crosses nodes as 16 bits, see
#: :func:`to_wire`) and moved bit-exactly as int16.
SUPPORTED_DTYPES = frozenset(
    {
        tf.uint8,
        tf.int8,
        tf.uint16,
        tf.int16,
        tf.int32,
        tf.int64,
        tf.float16,
        tf.bfloat16,
        tf.float32,
        tf.float64,
        tf.bool,
    }
)


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
    if op is not None and dtype == tf.bool and op not in (_ops.Min, _ops.Max, _ops.Product):
        raise ValueError(
            f"hvdlite {what}: a bool tensor can only be reduced with op=Min (and), Max (or) "
            "or Product (and); cast it to an integer type to sum or average."
        )


def check_process_set(process_set, what: str) -> None:
    """Fail at call time (when a graph op is built, not when the graph runs) for a set
    that is not registered, as Horovod does, or that this rank is not in: an
    InvalidArgumentError, as Horovod's ops raise, that is also a ValueError."""
    if not isinstance(process_set, _process_sets.ProcessSet):
        raise _errors.ArgumentError(
            message=f"hvdlite {what}: process_set must be a hvd.ProcessSet, got "
            f"{type(process_set).__name__}."
        )
    if process_set is not _process_sets.global_process_set:
        set_id = process_set.process_set_id
        registered = None if set_id is None else _basics.registered_process_set(set_id)
        if registered is None or registered.ranks != process_set.ranks:
            raise _errors.ArgumentError(
                message=f"hvdlite {what}: {process_set} is not registered; pass it to "
                "hvd.init(process_sets=[...]) or hvd.add_process_set() first."
            )
    if not process_set.included():
        raise _errors.ArgumentError(
            message=f"hvdlite {what}: this rank ({_basics.rank()}) is not a member of "
            f"process set {process_set.ranks}; only its members may call collectives on it."
        )


def normalize_name(name: str) -> str:
    """TensorFlow op-name rules: keep [A-Za-z0-9_], replace the rest with '_'."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def op_name(
    kind: str, tensors: Sequence, name: str | None, ignore_name_scope: bool = False
) -> str | None:
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


def framework_dtypes(dtypes) -> tuple:
    """The TensorFlow dtype names of a call's tensors where the engine is handed
    another dtype for one of them (float16 and bfloat16 reduced as float32, bfloat16
    moved as int16 bits), for the ranks to agree on as Horovod's do: a rank with
    bfloat16 and one with float32 are told so, not summed together; () otherwise,
    where the engine compares the dtypes it sees."""
    if any(d in (tf.float16, tf.bfloat16) for d in dtypes):
        return tuple(d.name for d in dtypes)
    return ()


def to_wire(tensor: tf.Tensor, *, reduce: bool, halves_as_is: bool = False) -> tf.Tensor:
    """bfloat16 and float16 are reduced as float32 (cast by TensorFlow: numpy's
    float16 casts are far slower for small values); bfloat16 moves bit-exactly as
    int16 otherwise.  Both go to a reduction as they are where *halves_as_is*:
    its allreduces cross nodes as 16 bits
    (:func:`hvdlite.basics.halves_cross_as_16_bits`; bfloat16 as numpy's, which
    is what ``Tensor.numpy()`` gives)."""
    if tensor.dtype == tf.float16:
        return tf.cast(tensor, tf.float32) if reduce and not halves_as_is else tensor
    if tensor.dtype != tf.bfloat16:
        return tensor
    if reduce:
        return tensor if halves_as_is else tf.cast(tensor, tf.float32)
    return tf.bitcast(tensor, tf.int16)


def from_wire(tensor: tf.Tensor, dtype: tf.DType, *, reduce: bool) -> tf.Tensor:
    """Undo :func:`to_wire`."""
    if dtype == tf.float16:
        return tf.cast(tensor, tf.float16) if reduce else tensor
    if dtype != tf.bfloat16:
        return tensor
    return tf.cast(tensor, tf.bfloat16) if reduce else tf.bitcast(tensor, tf.bfloat16)


class Scaling:
    """Where a reduction's pre/postscale factors are applied: by the engine, or here.

    The engine reduces float16 in float32 and applies the factors to the float32
    values, rounding to float16 once at the end.  Horovod scales the float16
    buffer itself: the prescaled input is rounded to float16 before the sum, and
    the postscale factor multiplies the sum already rounded to float16 (in
    float32, then rounded again).  At sizes that are not powers of two the two
    differ by an ulp, and Horovod's suites compare with zero tolerance; each
    rank checks its own shard of a reducescatter, so an ulp on one rank only
    puts the ranks on different paths through a test.  So a group holding a
    float16 tensor with a factor other than 1 is scaled here, in Horovod's
    order, and the engine gets op Sum and no factors (Average folds into the
    postscale factor as 1/size, as in Horovod's core).  Every other dtype of
    such a group is scaled exactly as the engine would: floats in their own
    precision (bfloat16 on its float32 wire), integers in float64, truncated.
    A sum that overflows float16 stays inf here, as in Horovod, where the
    engine path would have kept it finite: so the engine keeps every group
    without a factor, Average included.
    """

    def __init__(self, dtypes, op, prescale_factor, postscale_factor, set_size: int):
        self.op, self.pre, self.post = op, prescale_factor, postscale_factor
        try:
            pre, post = float(prescale_factor), float(postscale_factor)
        except (TypeError, ValueError):  # the engine says what is wrong with them
            pre = post = 1.0
        self.here = tf.float16 in dtypes and (pre != 1.0 or post != 1.0)
        if not self.here:
            return
        if op == _ops.Average:
            op, post = _ops.Sum, post / set_size
        self.op, self.pre, self.post = op, 1.0, 1.0
        self._pre, self._post = pre, post

    def before(self, wire: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        """One wire tensor (of a tensor of ``dtype``), prescaled where the adapter scales."""
        if not self.here:
            return wire
        scaled = _scale_wire(wire, dtype, self._pre)
        # a float16 wire stays float16 (the scaled value is rounded to float16 already)
        return tf.cast(scaled, tf.float16) if wire.dtype == tf.float16 else scaled

    def after(self, wire: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        """One reduced wire tensor, postscaled where the adapter scales."""
        return _scale_wire(wire, dtype, self._post) if self.here else wire


def _scale_wire(wire: tf.Tensor, dtype: tf.DType, factor: float) -> tf.Tensor:
    if factor == 1.0:
        return wire
    if dtype == tf.float16:  # the float16 value times float32(factor), rounded to float16
        half = tf.cast(tf.cast(wire, tf.float16), tf.float32)
        return tf.cast(tf.cast(half * tf.constant(factor, tf.float32), tf.float16), tf.float32)
    if wire.dtype.is_floating:
        return wire * tf.constant(factor, wire.dtype)
    return tf.cast(tf.cast(wire, tf.float64) * factor, wire.dtype)


#: TensorFlow (Eigen's largest alignment) adopts a numpy function's output
#: array without a copy where its data starts on a multiple of this many bytes.
_ADOPTED_ALIGNMENT = 64


def fresh_output(shape, dtype) -> np.ndarray:
    """A new uninitialised array for a graph node's output, aligned so that
    TensorFlow adopts it instead of copying it (see the module docstring)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ADOPTED_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _ADOPTED_ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _as_array(value) -> np.ndarray:
    array = np.asarray(value)  # zero-copy view of an eager CPU tensor
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def run(
    fn: Callable[..., Sequence[np.ndarray]],
    inputs: Sequence[tf.Tensor],
    out_dtypes: Sequence[tf.DType],
    out_shapes: Sequence,
    name: str | None = None,
    *,
    outputs_like_inputs: int = 0,
    collective: bool = True,
    ordered: bool = True,
) -> list[tf.Tensor]:
    """Run ``fn(*arrays, outputs=...) -> arrays`` on tensors, eagerly or as one graph node.

    ``fn`` receives C-contiguous numpy arrays and must return arrays of exactly
    ``out_dtypes``.  In a graph the outputs get ``out_shapes`` (None entries
    for unknown dimensions).

    Errors (``collective``, the default): eagerly, a mismatch across ranks
    raises :class:`~hvdlite.tensorflow._errors.MismatchError` (a
    FailedPreconditionError) and a ValueError raises
    :class:`~hvdlite.tensorflow._errors.ArgumentError` (an
    InvalidArgumentError); in a graph the run fails with the same TensorFlow
    classes.  Other exceptions propagate unchanged eagerly and as
    ``tf.errors.UnknownError`` in a graph.

    ``ordered`` (graph only): chain this node after the collectives created
    before it in the graph (see the module docstring).  Only helpers whose
    node is meant to run on its own turn it off.

    ``outputs_like_inputs=k`` says the first k outputs have the shapes and
    dtypes of the first k inputs.  In a graph, ``fn`` then gets
    ``outputs=[k arrays]`` to write into: fresh arrays every run, which
    TensorFlow adopts as the node's outputs without a copy (see the module
    docstring).  Eagerly, and when k is 0, ``outputs`` is None.
    """
    inputs = list(inputs)
    if tf.executing_eagerly():
        if _device.wants_device_path(inputs):
            with _errors.translated() if collective else contextlib.nullcontext():
                return _device.run_eager(fn, inputs, out_dtypes)
        with _errors.translated() if collective else contextlib.nullcontext():
            outs = fn(*[_as_array(x) for x in inputs], outputs=None)
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, out_dtypes, strict=True)]

    if _in_xla_context():
        raise ValueError(
            "hvdlite collectives cannot run inside an XLA-compiled function (jit_compile=True): "
            "they call into Python.  Use jit_compile=False, e.g. "
            "model.compile(..., jit_compile=False) or tf.function(jit_compile=False). "
            "(GPU tensors are moved without a host copy only in eager mode; in a tf.function "
            "TensorFlow copies a collective's tensors to the host.)"
        )
    np_dtypes = [d.as_numpy_dtype for d in out_dtypes]

    def graph_fn(*arrays):
        arrays = [_as_array(a) for a in arrays]
        outputs = None
        if outputs_like_inputs:
            outputs = [fresh_output(a.shape, a.dtype) for a in arrays[:outputs_like_inputs]]
        try:
            outs = fn(*arrays, outputs=outputs)
        except HorovodInternalError as e:
            if not (collective and _errors.is_mismatch(e)):
                raise
            # Placeholders: the gate fails the run before anything reads them.
            return [np.empty((0,), d) for d in np_dtypes] + [str(e).encode()]
        outs = [np.asarray(o, dtype=d) for o, d in zip(outs, np_dtypes, strict=True)]
        return outs + [b""] if collective else outs

    op = None if name is None else normalize_name(name.rsplit("/", 1)[-1])[:120] or None
    dtypes = list(out_dtypes) + ([tf.string] if collective else [])
    graph = tf.compat.v1.get_default_graph()
    with chain_link(graph) if collective and ordered else contextlib.nullcontext([]) as created:
        outs = tf.numpy_function(graph_fn, inputs, dtypes, stateful=True, name=op)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        outs = list(outs)
        created.append(outs[0].op)
    if collective:
        failure = outs.pop()
        failure.set_shape([])
    for out, shape in zip(outs, out_shapes, strict=True):
        out.set_shape(shape)
    return _errors.gate(outs, failure) if collective else outs


# graph -> {control-flow context: the last collective node created in it}
_CHAINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def chain_link(graph=None):
    """Create the next link of ``graph``'s chain of collectives after the previous one.

    Yields a list; the caller appends the op it created (a collective node, or
    a ``tf.cond`` whose branches hold collectives), which becomes the next
    link's predecessor.  The chain is kept per control-flow context of a
    ``tf.compat.v1`` graph (a node inside a while loop cannot depend on one
    outside it, nor the other way round); TF2 control flow builds separate
    graphs, each with its own chain.
    """
    graph = tf.compat.v1.get_default_graph() if graph is None else graph
    context = graph._get_control_flow_context()  # None outside a v1 cond / while loop
    chain = _CHAINS.get(graph)
    if chain is None:
        chain = _CHAINS[graph] = {}
    previous = chain.get(context)
    created: list = []
    if previous is None:
        yield created
    else:
        with graph.control_dependencies([previous]):
            yield created
    if created:
        chain[context] = created[-1]


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
    found = _basics.registered_process_set(process_set_id)
    if found is None:
        raise ValueError(
            f"hvdlite: no process set with id {process_set_id} is registered; register it "
            "with hvd.init(process_sets=[...]) or hvd.add_process_set() first."
        )
    return found
