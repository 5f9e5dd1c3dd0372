"""Synthetic training throughput (images/s) of a small convnet with hvdlite.torch.

    hvdrun -np 2 python examples/torch_synthetic_benchmark.py
    hvdrun -np 2 python examples/torch_synthetic_benchmark.py --fp16-allreduce

Horovod's synthetic benchmark with a model that needs no torchvision: random
images and labels, ``hvd.DistributedOptimizer``, and img/s per rank and in
total (mean +- 1.96 standard deviations over the timed iterations).
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import torch
import torch.nn.functional as F
from torch import nn

import hvdlite.torch as hvd


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fp16-allreduce", action="store_true", help="send gradients as float16 (Compression.fp16)"
    )
    parser.add_argument("--use-adasum", action="store_true", help="reduce with op=Adasum")
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=32, help="channels of the first conv")
    parser.add_argument("--num-warmup-batches", type=int, default=5)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    return parser.parse_args(argv)


def small_convnet(width: int, classes: int = 10) -> nn.Module:
    def block(cin, cout):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )

    return nn.Sequential(
        block(3, width),
        block(width, 2 * width),
        block(2 * width, 4 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, classes),
    )


def main(argv=None) -> None:
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model = small_convnet(args.width)
    lr_scaler = 1 if args.use_adasum else hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler, momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 10, (args.batch_size,))

    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"model: small convnet ({n_params / 1e6:.2f} M parameters), batch size "
        f"{args.batch_size} per rank, {hvd.size()} rank(s), "
        f"{'fp16' if args.fp16_allreduce else 'no'} compression"
    )
    log("running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    rates = []
    for i in range(args.num_iters):
        elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / elapsed
        log(f"iter #{i}: {rate:.1f} img/sec per rank")
        rates.append(rate)

    mean = statistics.mean(rates)
    conf = 1.96 * (statistics.stdev(rates) if len(rates) > 1 else 0.0)
    per_rank = hvd.allgather_object(mean)
    log(
        f"img/sec per rank: {mean:.1f} +-{conf:.1f} (rank 0); all ranks: "
        + ", ".join(f"{r:.1f}" for r in per_rank)
    )
    log(f"total img/sec on {hvd.size()} rank(s): {sum(per_rank):.1f} +-{conf * hvd.size():.1f}")


if __name__ == "__main__":
    main()
