"""The adapter kit, written once: the names every framework module re-exports
(``hvdlite.common``), the compressor base (``hvdlite.compression``) and the
elastic value helpers (``hvdlite.elastic.model_state``).  Nothing here starts MPI.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from hvdlite import basics, common
from hvdlite.compression import CastCompressor, Compressor, NoneCompressor
from hvdlite.elastic.model_state import assign_values, values_of
from hvdlite.elastic.persistence import ElasticStateError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_ADAPTERS = [
    ("torch", "hvdlite.torch"),
    ("jax", "hvdlite.jax"),
    ("tensorflow", "hvdlite.tensorflow"),
    ("keras", "hvdlite.tensorflow.keras"),
    ("keras", "hvdlite.keras"),
]


@pytest.mark.parametrize("framework,module_name", _ADAPTERS, ids=[m for _, m in _ADAPTERS])
def test_every_adapter_re_exports_the_common_names_as_the_same_objects(framework, module_name):
    pytest.importorskip(framework)
    if module_name == "hvdlite.tensorflow.keras":
        import keras

        if keras.backend.backend() != "tensorflow":
            pytest.skip("hvdlite.tensorflow.keras needs KERAS_BACKEND=tensorflow")
    module = importlib.import_module(module_name)
    names = module.__all__
    assert len(names) == len(set(names)), "a name listed twice"
    for name in common.__all__:
        assert name in names, name
        assert getattr(module, name) is getattr(common, name), name
    for name in names:
        getattr(module, name)
    compression = module.Compression
    assert compression.none is NoneCompressor
    for cast in (compression.fp16, compression.bf16):
        assert issubclass(cast, CastCompressor) and issubclass(cast, Compressor), cast
        assert cast.wire_dtype is not None, cast


def test_tensorflow_mpi_ops_serves_the_common_names_as_horovods_does():
    pytest.importorskip("tensorflow")
    from hvdlite.tensorflow import mpi_ops

    for name in common.__all__:
        assert getattr(mpi_ops, name) is getattr(common, name), name


def test_the_common_names_are_the_basics_then_the_ops_sets_and_error():
    assert common.__all__[: len(basics.__all__)] == basics.__all__
    assert len(common.__all__) == len(set(common.__all__))
    for name in common.__all__:
        assert getattr(common, name) is not None
    import hvdlite

    assert set(basics.__all__) <= set(hvdlite.__all__)
    for name in basics.__all__:
        assert getattr(hvdlite, name) is getattr(basics, name)


class _NumpyCast(CastCompressor):
    """The base's contract, with numpy filling in the framework's part."""

    wire_dtype = np.dtype(np.float16)

    @classmethod
    def should_cast(cls, dtype) -> bool:
        return np.issubdtype(dtype, np.floating) and dtype != cls.wire_dtype

    @staticmethod
    def cast(tensor, dtype):
        return tensor.astype(dtype)


def test_a_cast_compressor_sends_the_wire_dtype_and_casts_back():
    x = np.linspace(0.0, 1.0, 5, dtype=np.float32)
    wire, ctx = _NumpyCast.compress(x)
    assert wire.dtype == np.float16 and ctx == np.float32
    back = _NumpyCast.decompress(wire, ctx)
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, x, atol=1e-3)
    already = np.ones(2, dtype=np.float32)
    assert _NumpyCast.decompress(already, np.dtype(np.float32)) is already


def test_a_cast_compressor_leaves_other_dtypes_alone_with_no_ctx():
    for x in (np.arange(4), np.ones(3, dtype=np.float16)):
        wire, ctx = _NumpyCast.compress(x)
        assert wire is x and ctx is None
        assert _NumpyCast.decompress(wire, ctx) is x


def test_the_none_compressor_is_the_identity_and_the_base_is_abstract():
    x = np.ones(3)
    assert NoneCompressor.compress(x) == (x, None)
    assert NoneCompressor.decompress(x, None) is x
    with pytest.raises(NotImplementedError):
        Compressor.compress(x)
    with pytest.raises(NotImplementedError):
        CastCompressor.compress(x)


class _Variable:
    """What the elastic value helpers need of a variable: ``numpy()`` and ``assign``."""

    def __init__(self, value):
        self.value = np.array(value, dtype=np.float32)

    def numpy(self):
        return self.value.copy()

    def assign(self, value):
        self.value[...] = value


def test_elastic_values_are_copies_that_assign_puts_back():
    variables = [_Variable([1.0, 2.0]), _Variable(3.0)]
    saved = values_of(variables)
    variables[0].assign([9.0, 9.0])
    assert saved[0].tolist() == [1.0, 2.0]
    assign_values(variables, saved, "model")
    assert variables[0].value.tolist() == [1.0, 2.0] and float(variables[1].value) == 3.0


def test_elastic_values_of_another_model_are_refused_naming_the_counts():
    with pytest.raises(ElasticStateError, match="holds 1 optimizer variables, this process has 2"):
        assign_values([_Variable(0.0), _Variable(1.0)], [np.zeros(())], "optimizer")
