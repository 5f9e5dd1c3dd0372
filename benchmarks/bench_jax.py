"""hvdlite.jax: a training step with DistributedOptimizer beside the same step
without communication, and the jit (host callback) path beside the eager one.

Run as ``python benchmarks/bench_jax.py`` (it starts its own 2-rank job with the
mpiexec beside this Python) or directly under ``mpiexec -n 2``.

Workload: MLP 784-1024-1024-10 (1.8 M float32 parameters, 7.3 MB of gradients),
batch 64 per rank, optax SGD with momentum, XLA's CPU client on one thread per
rank.  Figures, each beside its baseline from the same run:

- ``jit`` step: the whole step jitted, ``DistributedOptimizer.update`` inside it
  (one ordered host callback per step); baseline: the same jitted step with
  plain optax (no communication);
- ``eager`` step: gradient and apply jitted, ``DistributedOptimizer.update``
  called eagerly between them (the engine reads the gradients through
  zero-copy host views); baseline: the same three calls with plain optax;
- ``jit`` step beside ``eager`` step: what the callback path costs over the
  eager one on a real step;
- one 4 KB and one 4 MB ``allreduce``, inside a jitted function beside an eager
  call: the callback path's cost per collective;
- for information, the eager step beside raw mpi4py: the same split step with
  one ``Allreduce`` over the gradients copied into one buffer.

Times are medians over repetitions, the figure's and its baseline's alternating
(so load from elsewhere on the machine hits both alike).
"""

from __future__ import annotations

import os
import sys

from _jobs import paired_times, run_self_or_launch, short_time  # this script's folder

BATCH = 64


def run_ranks() -> None:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    )
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from mpi4py import MPI

    import hvdlite.jax as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    rank = hvd.rank()

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    sizes = [(784, 1024), (1024, 1024), (1024, 10)]
    params = [
        {"w": jax.random.normal(k, s) * s[0] ** -0.5, "b": jnp.zeros(s[1])}
        for k, s in zip(keys, sizes, strict=True)
    ]
    rs = np.random.RandomState(rank)
    x = jnp.asarray(rs.randn(BATCH, 784).astype(np.float32))
    y = jnp.asarray(rs.randint(0, 10, BATCH).astype(np.int32))

    def loss_fn(params, x, y):
        h = x
        for layer in params[:-1]:
            h = jax.nn.relu(h @ layer["w"] + layer["b"])
        out = h @ params[-1]["w"] + params[-1]["b"]
        return optax.softmax_cross_entropy_with_integer_labels(out, y).mean()

    def jitted_step(tx):
        @jax.jit
        def step(params, state):
            grads = jax.grad(loss_fn)(params, x, y)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        return step

    grad = jax.jit(jax.grad(loss_fn))
    apply = jax.jit(optax.apply_updates)

    def split_step(tx, reduce=None):
        update = jax.jit(tx.update) if reduce is None else tx.update

        def step(params, state):
            grads = grad(params, x, y)
            if reduce is not None:
                grads = reduce(grads)
            updates, state = update(grads, state, params)
            return apply(params, updates), state

        return step

    def raw_mpi_reduce(grads):
        leaves, treedef = jax.tree_util.tree_flatten(grads)
        flat = np.concatenate([np.asarray(g).ravel() for g in leaves])
        comm.Allreduce(MPI.IN_PLACE, flat, MPI.SUM)
        flat /= comm.Get_size()
        out, at = [], 0
        for g in leaves:
            out.append(jnp.asarray(flat[at : at + g.size].reshape(g.shape)))
            at += g.size
        return jax.tree_util.tree_unflatten(treedef, out)

    def runner(step, tx):
        holder = {"params": params, "state": tx.init(params)}

        def run():
            p, s = step(holder["params"], holder["state"])
            jax.block_until_ready(p)
            holder["params"], holder["state"] = p, s

        for _ in range(5):  # compile and warm up
            run()
        return run

    sgd = optax.sgd(1e-3, momentum=0.9)
    dist = hvd.DistributedOptimizer(optax.sgd(1e-3, momentum=0.9), name="bench")
    modes = {
        "jit": runner(jitted_step(dist), dist),
        "jit_nocomm": runner(jitted_step(sgd), sgd),
        "eager": runner(split_step(dist), dist),
        "eager_nocomm": runner(split_step(sgd), sgd),
        "eager_mpi": runner(split_step(sgd, raw_mpi_reduce), sgd),
    }
    rows = []

    def pair(label, a, b, base_label, iters=10, repeats=9):
        t_a, t_b = paired_times(modes[a], modes[b], iters, repeats, comm.Barrier)
        rows.append((label, t_a, base_label, t_b))

    pair("step, DistributedOptimizer in jit", "jit", "jit_nocomm", "same jitted step, no comm")
    pair("step, eager DistributedOptimizer", "eager", "eager_nocomm", "same split step, no comm")
    pair("step: jit (callback) vs eager", "jit", "eager", "eager DistributedOptimizer step")
    pair("step, eager vs raw mpi4py (info)", "eager", "eager_mpi", "1 Allreduce, copies in/out")

    for label, elements in (("4 KB", 1024), ("4 MB", 1 << 20)):
        a = jnp.ones(elements, jnp.float32)
        in_jit = jax.jit(lambda v: hvd.allreduce(v, op=hvd.Sum, name="bench.jit"))

        def jit_call(a=a, in_jit=in_jit):
            in_jit(a).block_until_ready()

        def eager_call(a=a):
            hvd.allreduce(a, op=hvd.Sum, name="bench.eager").block_until_ready()

        for _ in range(5):
            jit_call()
            eager_call()
        iters = 100 if elements < 4096 else 10
        t_jit, t_eager = paired_times(jit_call, eager_call, iters, 11, comm.Barrier)
        rows.append(
            (f"allreduce {label}: jit vs eager", t_jit, f"eager allreduce {label}", t_eager)
        )

    if rank == 0:
        print(
            f"\nhvdlite.jax benchmark: {comm.Get_size()} ranks, jax {jax.__version__}, "
            f"MLP 784-1024-1024-10, batch {BATCH}/rank, SGD momentum, 1 XLA thread/rank"
        )
        print(f"{'figure':36} {'hvdlite':>10} {'baseline':>10} {'ratio':>7}  baseline is")
        for label, t, base_label, tb in rows:
            print(
                f"{label:36} {short_time(t):>10} {short_time(tb):>10} {t / tb:>6.2f}x  {base_label}"
            )
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(run_self_or_launch(run_ranks, __file__))
