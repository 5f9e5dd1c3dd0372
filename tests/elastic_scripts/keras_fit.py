"""Keras ``model.fit`` under ``@hvd.elastic.run`` with Horovod's elastic callbacks.

Two epochs of a tiny regression; ``--kill-rank R --kill-at B``: in launch 0,
rank R SIGKILLs itself after global batch B.  Rank 0 prints the epochs the
state counted and the final loss at the end.
"""

import argparse
import os
import signal

import numpy as np
import keras

import hvdlite.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--kill-rank", type=int, default=-1)
parser.add_argument("--kill-at", type=int, default=-1)
args = parser.parse_args()

hvd.init()
launch = int(os.environ.get("HVDLITE_ELASTIC_GENERATION", "0"))
keras.utils.set_random_seed(0)
model = keras.Sequential(
    [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
)
model.compile(
    optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse"
)
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(args.steps * 8, 4)).astype("float32")
y = np.sin(x.sum(axis=1, keepdims=True))
state = hvd.elastic.KerasState(model, epoch=0, batch=0)
batches_done = [0]


class KillSwitch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if launch == 0 and hvd.rank() == args.kill_rank and batches_done[0] == args.kill_at:
            print(f"rank {hvd.rank()} kills itself after {batches_done[0]} batches", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        batches_done[0] += 1


callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
    KillSwitch(),
]


@hvd.elastic.run
def train(state):
    history = model.fit(
        x,
        y,
        batch_size=8,
        epochs=args.epochs - state.epoch,
        callbacks=callbacks,
        verbose=0,
        shuffle=False,
    )
    return history.history["loss"][-1]


loss = train(state)
if hvd.rank() == 0:
    print(f"fit done: state.epoch={state.epoch} loss={loss:.4f} size={hvd.size()}", flush=True)
