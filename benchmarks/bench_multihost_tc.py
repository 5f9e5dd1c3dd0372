"""Flat against hierarchical collectives across hosts joined by a slow link, same run.

Run as root: ``python benchmarks/bench_multihost_tc.py``.  It builds pretend machines
(``--hosts``, default 3: network namespaces with their own sshd,
``tests/helpers_runner/netns_hosts.py``), shapes each one's link to the switch with
``tc netem`` (default 1 Gbit/s and 0.2 ms each way; a token bucket for the rate alone
where the kernel has no netem), and runs ``hvdrun -H h1:2,h2:2,...`` jobs (2 ranks per
host) from h1: ranks on one host share memory, ranks on different hosts talk over the
shaped links (both of each host's networks are shaped: MPI may pick either).  Jobs
alternate between the flat setting, ``HVDLITE_HIERARCHICAL_ALLREDUCE=1`` /
``HVDLITE_HIERARCHICAL_ALLGATHER=1`` and ``HVDLITE_HALF_SUMS_PER_HOP=1`` (float16
partial sums rounded at every hop of the ring; ``--settings`` picks some).
Each job times allreduce of 4 MB and 64 MB, a float16 allreduce of 32 MB (the
hierarchical jobs reduce it in two levels with 16 bits across hosts, the flat jobs
on the flat 16-bit wire; the pair is printed as a ratio line, with the torch steps
under ``Compression.fp16`` and ``.bf16``), allgather of 16 MB per rank and torch
training steps (an MLP with 16 MB of gradients, ``DistributedOptimizer`` over SGD
without and with ``Compression.fp16`` and ``.bf16``, and over AdamW unsharded and with
``shard_optimizer_state=True``; the two ratios are printed after the table for the
flat and the hierarchical jobs), and a reduce-scatter of 8 M values as float32 and as
float16 (16 bits across hosts; the pair printed as a ratio with its bytes): the median
over iterations of the slowest rank.  The bytes h2 received on its link during each
case are counted, so the table shows the measured cross-host bytes beside the times.
Each job then trains three models, the MLP, ResNet-18 on 64x64 images and a small
transformer language model, under hvdlite and under torch DDP over gloo on the same
ranks and links (``hvdrun --master-port`` gives them ``MASTER_ADDR``/``MASTER_PORT``),
one DDP step after each hvdlite step, without and with fp16 (DDP's fp16 compress
hook against ``Compression.fp16``), and the pairs are printed as ratios with the
bytes into h2; a third step of each model without any communication gives each
setting's floor without overlap (that compute plus its bytes at the link's rate),
printed beside DDP's step.
Then one ``hvdrun --autotune`` job trains the same MLP with hierarchical allreduce
offered to the tuner, and the setting it kept is printed beside the step time it gets.
Where the hosts cannot be built (not root, no ``ip``/``tc``/sshd) it says why and
exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

RESULT = "BENCH-RESULT "
CASES = (
    ("allreduce", 4),
    ("allreduce", 64),
    ("allreduce fp16", 32),
    ("allgather", 16),
    ("torch step", 16),
    ("torch step fp16", 16),
    ("torch step bf16", 16),
    ("AdamW step", 16),
    ("AdamW sharded", 16),
    ("reducescatter", 32),
    ("reducescatter fp16", 16),
)
WIDTH, LAYERS, BATCH = 1024, 4, 32  # the MLP: 4 x 1024 x 1024 weights, 16 MB of gradients
IMAGE, IMAGES = 64, 8  # ResNet-18 on 64x64 images, 8 per rank: 45 MB of gradients
VOCAB, SEQ, SEQS = 4096, 32, 4  # the transformer: 4 layers of 256, 22 MB of gradients
#: the models trained under hvdlite and under DDP side by side
MODELS = ("MLP", "ResNet-18", "transformer")
#: (model, wire) pairs timed against DDP: every model without and with float16
#: compression.  Not bfloat16: DDP's bf16 compress hook over gloo ended these jobs
#: at its first step with exit 1 and no error from any rank (torch 2.13).
DDP_PAIRS = tuple((m, w) for m in MODELS for w in ("fp32", "fp16"))
DDP_PORT = 29517  # torch.distributed's rendezvous on h1 (hvdrun --master-port)


def _mlp():
    """The benchmark's MLP, the same weights on every rank and in every job."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _resnet18():
    """ResNet-18 (ImageNet's layout: a 7x7 stem, four stages of two basic blocks)
    for 100 classes, the same weights on every rank."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.skip = nn.Identity()
            if stride != 1 or cin != cout:
                self.skip = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 100)]
    return nn.Sequential(*layers)


def _transformer():
    """A small language model: token embedding, 4 encoder layers (width 256, 4
    heads), a linear head over the vocabulary; the same weights on every rank."""
    import torch
    from torch import nn

    class LanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 256)
            layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
            self.head = nn.Linear(256, VOCAB)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    torch.set_num_threads(1)
    torch.manual_seed(0)
    return LanguageModel()


def _model(name: str):
    return {"MLP": _mlp, "ResNet-18": _resnet18, "transformer": _transformer}[name]()


def _batch(name: str):
    """A fixed random batch for model *name* and its loss function."""
    import torch

    f = torch.nn.functional
    torch.manual_seed(1)
    if name == "ResNet-18":
        x, y = torch.randn(IMAGES, 3, IMAGE, IMAGE), torch.randint(0, 100, (IMAGES,))
        return x, y, f.cross_entropy
    if name == "transformer":
        tokens = torch.randint(0, VOCAB, (SEQS, SEQ + 1))
        return (
            tokens[:, :-1],
            tokens[:, 1:],
            lambda out, y: f.cross_entropy(out.reshape(-1, VOCAB), y.reshape(-1)),
        )
    return torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH), f.mse_loss


def _training_step(model, opt, name: str = "MLP"):
    """One SGD step of *model* (model *name*) on a fixed random batch (a closure to time)."""
    x, y, loss = _batch(name)

    def step():
        opt.zero_grad()
        loss(model(x), y).backward()
        opt.step()

    return step


def _ddp_step(wire: str, name: str = "MLP"):
    """Model *name*'s SGD step under torch DDP (gloo), with DDP's fp16 or bf16
    compress hook where *wire* says (a closure to time; the process group is up)."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = torch.nn.parallel.DistributedDataParallel(_model(name))
    if wire == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif wire == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return _training_step(model, opt, name)


def _against_ddp(iters: int, comm, received) -> dict:
    """hvdlite's step of each model beside DDP (gloo)'s on the same ranks, links
    and model, without and with compression (hvdlite: ``Compression.fp16`` or
    ``.bf16``; DDP: its compress hook of the same dtype), the pairs of
    :data:`DDP_PAIRS`: each iteration times one step of each, in turn, and counts
    the bytes into this host around each.  Keys ``DDP pair <model> <wire> <side>``."""
    import os

    import torch.distributed as dist
    from mpi4py import MPI

    from helpers_runner.netns_hosts import DATA_IFACE

    os.environ.setdefault("GLOO_SOCKET_IFNAME", DATA_IFACE)  # the host's own network
    dist.init_process_group("gloo", rank=comm.Get_rank(), world_size=comm.Get_size())
    out = {}
    for name, wire in DDP_PAIRS:
        sides = {"hvdlite": _torch_step(wire=wire, name=name), "DDP": _ddp_step(wire, name)}
        if wire == "fp32":  # the same step with no communication at all: the floor's compute
            sides["compute"] = _compute_step(name)
        times = {side: [] for side in sides}
        into = dict.fromkeys(sides, 0)
        for fn in sides.values():
            fn()
        for _ in range(iters):
            for side, fn in sides.items():
                comm.Barrier()
                before = received()
                start = time.perf_counter()
                fn()
                elapsed = time.perf_counter() - start
                comm.Barrier()  # the other rank of this host has its bytes too
                into[side] += received() - before
                times[side].append(comm.allreduce(elapsed, op=MPI.MAX))
        for side in sides:
            per_call = into[side] / iters if comm.Get_rank() == 2 else 0.0
            key = f"DDP pair {name} {wire} {side}"
            out[key] = (statistics.median(times[side]), comm.allreduce(per_call))
    dist.destroy_process_group()
    return out


def _compute_step(name: str):
    """Model *name*'s SGD step with no communication (a closure to time)."""
    import torch

    model = _model(name)
    return _training_step(model, torch.optim.SGD(model.parameters(), lr=1e-3), name)


def _torch_step(adamw: bool = False, sharded: bool = False, wire: str = "fp32", name="MLP"):
    """A training step of model *name* with DistributedOptimizer (a closure to
    time): SGD (with ``Compression.fp16`` or ``.bf16`` where *wire* says so), or
    AdamW with its state unsharded or sharded over the ranks."""
    import torch

    import hvdlite.torch as hvd_torch

    model = _model(name)
    if adamw:
        inner = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        inner = torch.optim.SGD(model.parameters(), lr=1e-3)
    opt = hvd_torch.DistributedOptimizer(
        inner,
        named_parameters=model.named_parameters(),
        shard_optimizer_state=sharded,
        compression={
            "fp32": hvd_torch.Compression.none,
            "fp16": hvd_torch.Compression.fp16,
            "bf16": hvd_torch.Compression.bf16,
        }[wire],
    )
    return _training_step(model, opt, name)


# ------------------------------------------------------------------ worker side
def worker(iters: int) -> None:
    import numpy as np
    from mpi4py import MPI

    import hvdlite as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    out = {}

    def received() -> int:  # bytes this host received on its two networks so far
        total = 0
        for iface in ("mgmt0", "data0"):
            with open(f"/sys/class/net/{iface}/statistics/rx_bytes") as f:
                total += int(f.read())
        return total

    for kind, mb in CASES:
        x = np.ones((mb << 20) // 4, np.float32)
        if kind == "allreduce fp16":  # 16-bit values, as Compression.fp16 hands over
            x = np.random.default_rng(hvd.rank()).standard_normal((mb << 20) // 2)
            x = x.astype(np.float16)
            fn = lambda x=x, mb=mb: hvd.allreduce(x, op=hvd.Average, name=f"b.h.{mb}")  # noqa: E731
        elif kind == "allreduce":
            fn = lambda x=x, mb=mb: hvd.allreduce(x, op=hvd.Sum, name=f"b.ar.{mb}")  # noqa: E731
        elif kind == "allgather":
            fn = lambda x=x, mb=mb: hvd.allgather(x, name=f"b.ag.{mb}")  # noqa: E731
        elif kind.startswith("reducescatter"):  # the same 8 M values, as 32 or 16 bits
            x = np.random.default_rng(hvd.rank()).standard_normal(8 << 20)
            x = x.astype(np.float16 if kind.endswith("fp16") else np.float32)
            fn = lambda x=x, k=kind: hvd.reducescatter(x, op=hvd.Average, name=f"b.{k}")  # noqa: E731
        elif kind.startswith("torch step"):
            fn = _torch_step(wire=kind.split()[-1] if kind != "torch step" else "fp32")
        else:
            fn = _torch_step(adamw=True, sharded=kind.endswith("sharded"))
        fn()
        times = []
        comm.Barrier()
        before = received()
        for _ in range(iters):
            comm.Barrier()
            start = time.perf_counter()
            fn()
            times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
        # rank 2 is on h2 (2 ranks per host): what its host received, per call
        per_call = (received() - before) / iters if hvd.rank() == 2 else 0.0
        out[f"{kind} {mb} MB"] = (statistics.median(times), comm.allreduce(per_call))
    out.update(_against_ddp(iters, comm, received))
    if hvd.rank() == 0:
        print(RESULT + json.dumps(out), flush=True)
    hvd.shutdown()


def autotune_worker(steps: int) -> None:
    """Train the MLP for *steps* steps under autotune; rank 0 prints the median time
    of the last steps (the kept setting's) as a result line."""
    from mpi4py import MPI

    import hvdlite as hvd

    hvd.init()
    step, comm, times = _torch_step(), MPI.COMM_WORLD, []
    for _ in range(steps):
        comm.Barrier()
        start = time.perf_counter()
        step()
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    if hvd.rank() == 0:
        print(RESULT + json.dumps({"last steps": statistics.median(times[-10:])}), flush=True)
    hvd.shutdown()


# ------------------------------------------------------------------ launcher side
def _shape(hosts, rate: str, delay: str) -> str:
    """Shape each host's link: netem (rate and delay) where the kernel has it, else a
    token bucket (rate only).  Returns what was applied."""
    from helpers_runner.netns_hosts import DATA_IFACE, MGMT_IFACE

    def tc(host, iface, *qdisc) -> bool:
        cmd = ["ip", "netns", "exec", host.namespace, "tc", "qdisc", "replace", "dev", iface]
        return subprocess.run([*cmd, "root", *qdisc], capture_output=True).returncode == 0

    applied = ""
    for host in hosts.hosts.values():
        for iface in (MGMT_IFACE, DATA_IFACE):  # MPI may pick either network
            if tc(host, iface, "netem", "delay", delay, "rate", rate):
                applied = f"{rate} and {delay} each way (tc netem)"
            elif tc(host, iface, "tbf", "rate", rate, "burst", "256kb", "latency", "100ms"):
                applied = f"{rate} (tc tbf; this kernel has no netem, so no added delay)"
            else:
                raise RuntimeError("tc could not shape the hosts' links (no netem, no tbf)")
    return applied


def _placement(hosts) -> list[str]:
    names = sorted(hosts.hosts)
    return ["-np", str(2 * len(names)), "-H", ",".join(f"{name}:2" for name in names)]


#: the jobs' settings: their knobs
SETTINGS = {
    "flat": {},
    "hierarchical": {"HVDLITE_HIERARCHICAL_ALLREDUCE": "1", "HVDLITE_HIERARCHICAL_ALLGATHER": "1"},
    # flat, float16 partial sums rounded at every hop of the ring (as DDP's fp16 hook)
    "per-hop": {"HVDLITE_HALF_SUMS_PER_HOP": "1"},
}


def run_job(hosts, setting: str, iters: int) -> tuple[dict, int]:
    from helpers_runner.common import clean_env, hvdrun_cmd, run
    from helpers_runner.netns_hosts import DATA_IFACE, MGMT_IFACE

    env = clean_env(**SETTINGS[setting])
    before = sum(hosts.rx_bytes("h2", i) for i in (MGMT_IFACE, DATA_IFACE))
    cmd = hvdrun_cmd(
        "--master-port",
        str(DDP_PORT),
        *_placement(hosts),
        sys.executable,
        __file__,
        "--worker",
        "--iters",
        str(iters),
    )
    result = run(hosts.wrap("h1", cmd), env=env, timeout=900)
    received = sum(hosts.rx_bytes("h2", i) for i in (MGMT_IFACE, DATA_IFACE)) - before
    lines = [line for line in result.stdout.splitlines() if RESULT in line]
    if result.returncode or not lines:
        saved = Path(tempfile.mkstemp(prefix="bench-tc-job-", suffix=".log")[1])
        saved.write_text(result.output)
        raise RuntimeError(
            f"job failed ({result.returncode}; its whole output: {saved}):\n{result.output[-4000:]}"
        )
    return json.loads(lines[-1].split(RESULT, 1)[1]), received


def run_autotune(hosts, steps: int, log: Path) -> tuple[float, dict]:
    """One ``hvdrun --autotune`` job (hierarchical allreduce offered to the tuner):
    the median step time at its end and the setting the tuner kept (its log's last row)."""
    import csv

    from helpers_runner.common import clean_env, hvdrun_cmd, run

    env = clean_env(
        HVDLITE_HIERARCHICAL_ALLREDUCE="1",
        HVDLITE_AUTOTUNE_WARMUP_SAMPLES="1",
        HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE="4",
        HVDLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES="12",
    )
    cmd = hvdrun_cmd(
        *_placement(hosts),
        "--autotune",
        "--autotune-log-file",
        str(log),
        sys.executable,
        __file__,
        "--autotune-worker",
        "--iters",
        str(steps),
    )
    result = run(hosts.wrap("h1", cmd), env=env, timeout=1200)
    lines = [line for line in result.stdout.splitlines() if RESULT in line]
    if result.returncode or not lines:
        raise RuntimeError(f"autotune job failed ({result.returncode}):\n{result.output[-4000:]}")
    rows = list(csv.DictReader(log.open()))
    kept = rows[-1] if rows else {}
    return json.loads(lines[-1].split(RESULT, 1)[1])["last steps"], kept


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--autotune-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hosts", type=int, default=3, choices=(2, 3))
    parser.add_argument("--autotune-steps", type=int, default=120)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--delay", default="0.2ms")
    parser.add_argument(
        "--settings",
        default=",".join(SETTINGS),
        help="the jobs' settings, comma-separated, from: " + ", ".join(SETTINGS),
    )
    parser.add_argument("--no-autotune", action="store_true", help="skip the autotune job")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.iters)
        return 0
    if args.autotune_worker:
        autotune_worker(args.iters)
        return 0
    settings = [name for name in args.settings.split(",") if name]
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {', '.join(SETTINGS)}")
    from helpers_runner.netns_hosts import NetnsHosts, reason_unavailable, remove_stale

    reason = reason_unavailable()
    if reason:
        print(f"bench_multihost_tc: skipped: {reason}")
        return 0
    remove_stale()
    workdir = Path(tempfile.mkdtemp(prefix="hvd-tc-"))
    names = tuple(f"h{i + 1}" for i in range(args.hosts))
    hosts = NetnsHosts(workdir, names).start()
    tuned = None
    try:
        shaped = _shape(hosts, args.rate, args.delay)
        runs = {name: [] for name in settings}
        for _ in range(args.rounds):
            for name in settings:
                runs[name].append(run_job(hosts, name, args.iters))
        if not args.no_autotune:
            tuned = run_autotune(hosts, args.autotune_steps, workdir / "autotune.csv")
    finally:
        hosts.stop()
    print(
        f"{args.hosts} hosts x 2 ranks, each host's link {shaped}; "
        f"median of {args.iters} iterations, best of {args.rounds} jobs per setting"
    )
    if "flat" in runs and "hierarchical" in runs:
        _print_hierarchical_vs_flat(runs)
        _print_halves_in_two_levels(runs)
    for name in settings:
        plain = min(r[0]["AdamW step 16 MB"][0] for r in runs[name])
        sharded = min(r[0]["AdamW sharded 16 MB"][0] for r in runs[name])
        print(
            f"AdamW step, shard_optimizer_state=True vs unsharded ({name} jobs): "
            f"{sharded * 1e3:.1f} ms vs {plain * 1e3:.1f} ms = {sharded / plain:.2f}x"
        )
    for name in settings:
        wide = min(r[0]["reducescatter 32 MB"] for r in runs[name])
        half = min(r[0]["reducescatter fp16 16 MB"] for r in runs[name])
        print(
            f"reducescatter of 8 M values, float16 vs float32 ({name} jobs): "
            f"{half[0] * 1e3:.1f} ms vs {wide[0] * 1e3:.1f} ms = {half[0] / wide[0]:.2f}x; "
            f"bytes into h2 {half[1] / 2**20:.1f} MB vs {wide[1] / 2**20:.1f} MB = "
            f"{half[1] / wide[1]:.2f}x"
        )
    for wire in ("fp16", "bf16"):
        for name in settings:
            plain = min(r[0]["torch step 16 MB"] for r in runs[name])
            half = min(r[0][f"torch step {wire} 16 MB"] for r in runs[name])
            print(
                f"torch MLP step, Compression.{wire} vs none ({name} jobs): "
                f"{half[0] * 1e3:.1f} ms vs {plain[0] * 1e3:.1f} ms = "
                f"{half[0] / plain[0]:.2f}x; bytes into h2 {half[1] / 2**20:.1f} MB vs "
                f"{plain[1] / 2**20:.1f} MB = {half[1] / plain[1]:.2f}x"
            )
    for model, precision in DDP_PAIRS:
        hook = "none" if precision == "fp32" else precision
        ddp = min(
            (r[0][f"DDP pair {model} {precision} DDP"] for job in runs.values() for r in job),
            key=lambda pair: pair[0],
        )
        for name in settings:
            ours = min(
                (r[0][f"DDP pair {model} {precision} hvdlite"] for r in runs[name]),
                key=lambda pair: pair[0],
            )
            print(
                f"torch {model} step, {precision} (hvdlite {name} jobs, DDP hook {hook}): "
                f"hvdlite {ours[0] * 1e3:.1f} ms vs DDP (gloo) {ddp[0] * 1e3:.1f} ms "
                f"= {ours[0] / ddp[0]:.2f}x; bytes into h2 {ours[1] / 2**20:.1f} MB vs "
                f"{ddp[1] / 2**20:.1f} MB = {ours[1] / ddp[1]:.2f}x"
            )
    _print_floors(runs, settings, _link_bytes_per_second(args.rate))
    if tuned is not None and "flat" in runs:
        _print_autotune(args.autotune_steps, tuned, runs["flat"])
    return 0


def _link_bytes_per_second(rate: str) -> float:
    """tc's rate (``1gbit``, ``500mbit``, ``100kbit``) in bytes per second."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale / 8
    raise ValueError(f"--rate {rate!r}: give it as tc does, e.g. 1gbit or 500mbit")


def _print_floors(runs, settings, link: float) -> None:
    """Each DDP pair's floor without overlap, from the same run: the model's step with
    no communication plus the bytes into h2 at the link's rate, for DDP and for each
    setting, beside DDP's step (a step below its floor hid that much behind backward)."""
    jobs = [r for job in runs.values() for r in job]
    for model, wire in DDP_PAIRS:
        compute = min(r[0][f"DDP pair {model} fp32 compute"][0] for r in jobs)
        ddp = min((r[0][f"DDP pair {model} {wire} DDP"] for r in jobs), key=lambda p: p[0])
        ddp_floor = compute + ddp[1] / link
        print(
            f"torch {model} step, {wire}: no communication {compute * 1e3:.1f} ms; DDP (gloo) "
            f"{ddp[0] * 1e3:.1f} ms = {ddp[0] / ddp_floor:.2f}x its floor without overlap "
            f"({compute * 1e3:.1f} ms + {ddp[1] / 2**20:.1f} MB at the link's rate "
            f"{ddp[1] / link * 1e3:.1f} ms)"
        )
        for name in settings:
            ours = min(
                (r[0][f"DDP pair {model} {wire} hvdlite"] for r in runs[name]),
                key=lambda pair: pair[0],
            )
            floor = compute + ours[1] / link
            print(
                f"torch {model} step, {wire}, floor without overlap ({name} jobs): "
                f"{compute * 1e3:.1f} ms + {ours[1] / 2**20:.1f} MB at the link's rate "
                f"{ours[1] / link * 1e3:.1f} ms = {floor * 1e3:.1f} ms = "
                f"{floor / ddp[0]:.2f}x DDP's step; hvdlite {ours[0] * 1e3:.1f} ms = "
                f"{ours[0] / floor:.2f}x its floor"
            )


def _print_hierarchical_vs_flat(runs) -> None:
    print(
        f"{'':18s}{'hierarchical':>14s}{'flat':>10s}{'ratio':>7s}"
        f"{'into h2, hier.':>16s}{'flat':>9s}{'ratio':>7s}"
    )
    for case in [c for c in runs["flat"][0][0] if not c.startswith("DDP pair")]:
        flat = min(r[0][case][0] for r in runs["flat"])
        hier = min(r[0][case][0] for r in runs["hierarchical"])
        flat_in = min(r[0][case][1] for r in runs["flat"])
        hier_in = min(r[0][case][1] for r in runs["hierarchical"])
        print(
            f"{case:18s}{hier * 1e3:12.1f}ms{flat * 1e3:8.1f}ms{hier / flat:7.2f}"
            f"{hier_in / 2**20:14.1f}MB{flat_in / 2**20:7.1f}MB{hier_in / flat_in:7.2f}"
        )
    flat_bytes = min(r[1] for r in runs["flat"])
    hier_bytes = min(r[1] for r in runs["hierarchical"])
    print(
        f"{'bytes into h2, a job':22s}{hier_bytes / 2**20:12.0f}MB{flat_bytes / 2**20:10.0f}MB"
        f"{hier_bytes / flat_bytes:8.2f}  (the cross-host bytes the hierarchical path saves)"
    )


def _print_halves_in_two_levels(runs) -> None:
    """float16 and bfloat16 through the two levels (node partial sums, 16 bits
    across hosts) against the flat 16-bit wire, from the same run's jobs."""
    for case in ("allreduce fp16 32 MB", "torch step fp16 16 MB", "torch step bf16 16 MB"):
        hier = min((r[0][case] for r in runs["hierarchical"]), key=lambda pair: pair[0])
        flat = min((r[0][case] for r in runs["flat"]), key=lambda pair: pair[0])
        print(
            f"{case}, hierarchical 16-bit vs flat 16-bit: {hier[0] * 1e3:.1f} ms vs "
            f"{flat[0] * 1e3:.1f} ms = {hier[0] / flat[0]:.2f}x; bytes into h2 "
            f"{hier[1] / 2**20:.1f} MB vs {flat[1] / 2**20:.1f} MB = {hier[1] / flat[1]:.2f}x"
        )


def _print_autotune(steps: int, tuned, flat_runs) -> None:
    tuned_step, kept = tuned
    flat_step = min(r[0]["torch step 16 MB"][0] for r in flat_runs)
    print(
        f"hvdrun --autotune, {steps} torch steps: kept "
        + ", ".join(f"{k}={v}" for k, v in kept.items() if k not in ("sample", "phase"))
    )
    print(
        f"{'torch step, tuned':18s}{tuned_step * 1e3:12.1f}ms{flat_step * 1e3:8.1f}ms"
        f"{tuned_step / flat_step:7.2f}  (last 10 steps of the autotune job vs the flat jobs)"
    )


if __name__ == "__main__":
    sys.exit(main())
