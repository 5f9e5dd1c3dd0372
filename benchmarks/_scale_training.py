"""Training at many ranks, checked against one process (run by bench_scale.py).

``mpiexec -n N python benchmarks/_scale_training.py torch|keras``: every rank
trains a small model on its rows of a global batch with hvdlite's
DistributedOptimizer (torch) or ``model.fit`` (Keras 3 on TensorFlow), trains
the same model alone on the whole global batch, and checks that the weights
(and, for Keras, the averaged loss) agree.  Rank 0 prints one line.
"""

from __future__ import annotations

import os
import sys

B = 4  # rows per rank per step


def _torch() -> str:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    steps = 10

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))

    def batch(step):
        g = torch.Generator().manual_seed(100 + step)
        return torch.randn(size * B, 5, generator=g), torch.randn(size * B, 3, generator=g)

    model, ref = make(), make()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    mine = slice(rank * B, (rank + 1) * B)
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        F.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    hvd.shutdown()
    return f"torch DistributedOptimizer, {steps} steps at {size} ranks: equal to one process"


def _keras() -> str:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    import numpy as np

    import hvdlite.tensorflow as hvd
    import hvdlite.tensorflow.keras as hk

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    steps, epochs = 5, 2
    rs = np.random.RandomState(0)
    x = rs.randn(steps * size * B, 6).astype(np.float32)
    y = rs.randn(steps * size * B, 3).astype(np.float32)

    def mine(a):
        return np.concatenate(
            [a[s * size * B + rank * B : s * size * B + (rank + 1) * B] for s in range(steps)]
        )

    def make():
        keras.utils.set_random_seed(1)
        return keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)]
        )

    model = make()
    model.compile(
        optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse"
    )
    hist = model.fit(
        mine(x),
        mine(y),
        batch_size=B,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[hk.callbacks.MetricAverageCallback()],
    )
    ref = make()
    ref.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    ref_hist = ref.fit(x, y, batch_size=size * B, epochs=epochs, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), ref.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(hist.history["loss"], ref_hist.history["loss"], rtol=1e-4)
    hvd.shutdown()
    return f"Keras fit, {epochs} epochs of {steps} steps at {size} ranks: equal to one process"


if __name__ == "__main__":
    line = {"torch": _torch, "keras": _keras}[sys.argv[1]]()
    if int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))) == 0:
        print(line, flush=True)
