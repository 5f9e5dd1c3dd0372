# A Keras program written for Horovod (horovod.tensorflow.keras), as Horovod's documentation
# writes one: the tests run it unchanged under `hvdrun --as-horovod`.
import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(64, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)

tf.random.set_seed(hvd.rank())  # a different start on every rank: the callback broadcasts
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.01 * hvd.size()
opt = tf.keras.optimizers.SGD(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt)
model.compile(loss="mse", optimizer=opt)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first epoch.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=0),
]

model.fit(x, y, batch_size=8, callbacks=callbacks, epochs=2, verbose=2 if hvd.rank() == 0 else 0)

kernel = model.layers[-1].kernel.numpy()
gathered = hvd.allgather(kernel.reshape(1, -1)).numpy()
same = bool((gathered == gathered[0]).all())
print(f"rank {hvd.rank()} of {hvd.size()}: weights the same on every rank: {same}")
