"""Synthetic-data training throughput (img/s) with hvdlite.tensorflow and a GradientTape loop.

    hvdrun -np 2 python examples/tensorflow2_synthetic_benchmark.py
    hvdrun -np 2 python examples/tensorflow2_synthetic_benchmark.py \\
        --model ResNet50 --image-size 224 --batch-size 32

The arguments follow Horovod's ``tensorflow2_synthetic_benchmark.py``; the
default model is small enough for a CPU laptop (MobileNetV2 on 64x64 images);
any ``keras.applications`` model name works (built with random weights, so
nothing is downloaded).  Each step is one ``tf.function``: forward, backward,
``DistributedGradientTape`` (one grouped allreduce for all gradients), update.
Rank 0 prints img/s per rank and in total.
"""

from __future__ import annotations

import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression on the wire")
    p.add_argument("--model", default="MobileNetV2", help="a keras.applications model")
    p.add_argument("--image-size", type=int, default=64, help="(+) square input size")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op threads per rank")
    return p.parse_args(argv)


def main(argv=None) -> float:
    args = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    model = getattr(keras.applications, args.model)(
        weights=None, input_shape=(args.image_size, args.image_size, 3)
    )
    opt = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    rs = np.random.RandomState(rank)
    data = tf.constant(
        rs.rand(args.batch_size, args.image_size, args.image_size, 3).astype(np.float32)
    )
    target = tf.constant(rs.randint(0, 1000, size=(args.batch_size,)))

    @tf.function
    def benchmark_step(first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        # Start from rank 0's state (after the first step, once the optimizer exists).
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    log(
        f"Model: {args.model} ({args.image_size}x{args.image_size}), batch size "
        f"{args.batch_size} per rank, {size} rank(s)"
    )
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)
    img_secs = []
    for i in range(args.num_iters):
        t = timeit.timeit(
            lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter
        )
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log(f"Iter #{i}: {img_sec:.1f} img/sec per rank")
        img_secs.append(img_sec)
    mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {size} rank(s): {size * mean:.1f} +-{size * conf:.1f}")
    return float(size * mean)


if __name__ == "__main__":
    main()
