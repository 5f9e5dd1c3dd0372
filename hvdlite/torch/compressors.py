"""Gradient compressors that keep state across steps: top-k and PowerSGD.

Horovod's compressors (:mod:`.compression`) are stateless casts applied
around each gradient's allreduce.  The two here are not: they remember, per
parameter, the part of the gradient they did not send (error feedback) and,
for PowerSGD, the factor matrix of the previous step (warm start).  So
:class:`~hvdlite.torch.DistributedOptimizer` recognises them
(:class:`StatefulCompressor`) and hands them every gradient of a step at once
(at ``synchronize()``, after backward): each compressor then runs its own
exchange, grouped over all parameters — one allgather per step for top-k, two
allreduces for PowerSGD.  Their state is keyed by parameter name and travels
with the optimizer's ``state_dict()`` under ``"hvdlite_compression"``.

The per-rank math is in methods that never communicate (``select``/
``scatter`` for top-k, ``project``/``back_project``/``approximate`` for
PowerSGD); :meth:`StatefulCompressor.reduce` is the glue that exchanges their
results through the engine.

Cross-rank contract: every rank of the process set uses the same compressor
with the same arguments on the same named parameters and calls ``reduce``
(via the optimizer) the same number of times.  Residuals are per rank: a
state dict restores exactly the rank that saved it; loaded on every rank
(a rank-0 checkpoint), each rank starts from rank 0's residual.
"""

from __future__ import annotations

import math
import zlib

import torch

from hvdlite.ops import Average, Sum
from hvdlite.torch.mpi_ops import grouped_allgather_async, grouped_allreduce_async_, synchronize

__all__ = [
    "StatefulCompressor",
    "TopKCompressor",
    "PowerSGDCompressor",
    "topk_count",
    "topk_indices",
]

STATE_KEY = "hvdlite_compression"  # the optimizer state_dict key holding our state


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision gradients (residuals need the mantissa), else dtype."""
    return torch.promote_types(dtype, torch.float32)


def _copy_into(grad: torch.Tensor, result: torch.Tensor) -> None:
    grad.copy_(result.reshape(grad.shape))


class StatefulCompressor:
    """A compressor owning per-parameter state, driven by DistributedOptimizer.

    Subclasses implement :meth:`reduce`, :meth:`state_dict` and
    :meth:`load_state_dict`.  They cannot be used with ``hvd.allreduce``.
    """

    kind = "stateful"

    def reduce(self, grads: list[tuple[str, torch.Tensor]], process_set, op) -> int:
        """Replace every gradient in *grads* (name, tensor) in place by its
        compressed reduction over *process_set* (op Average or Sum); returns
        the payload bytes this rank submitted to the engine."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def _check_kind(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("kind") != self.kind:
            found = state.get("kind") if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"the optimizer state holds '{found}' compression state, but this "
                f"DistributedOptimizer uses {self!r}; wrap it with the same "
                f"compression that wrote the checkpoint"
            )

    def compress(self, tensor):
        """Refused: the optimizer calls :meth:`reduce` instead."""
        raise TypeError(
            f"{self!r} keeps per-parameter state across steps and works only as "
            "DistributedOptimizer(compression=...); for a single allreduce use "
            "Compression.fp16 or Compression.bf16"
        )

    def decompress(self, tensor, ctx):
        """Refused, like :meth:`compress`."""
        self.compress(tensor)


# ---------------------------------------------------------------------- top-k


def topk_count(numel: int, ratio: float) -> int:
    """How many entries top-k sends of a tensor with *numel* entries."""
    return max(1, min(numel, math.ceil(ratio * numel)))


_SAMPLE_STRIDE = 97  # odd and prime: a strided sample does not follow a matrix's columns
_SAMPLED_ABOVE = 32768  # smaller tensors: one plain torch.topk is as fast


def topk_indices(magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the *k* largest entries of the 1-d *magnitudes* (any order).

    The same set as ``torch.topk`` (up to ties), found faster on large
    tensors: a strided sample estimates a threshold that about 2k entries
    exceed, and only those candidates are ranked.  If fewer than k pass, the
    full ``torch.topk`` runs instead, so the result is always exact.
    """
    n = magnitudes.numel()
    if n < _SAMPLED_ABOVE or 4 * k > n:
        return torch.topk(magnitudes, k, sorted=False).indices
    sample = magnitudes[::_SAMPLE_STRIDE]
    wanted = min(sample.numel(), math.ceil(2 * k * sample.numel() / n))
    threshold = torch.topk(sample, wanted, sorted=False).values.min()
    candidates = (magnitudes >= threshold).nonzero().squeeze(1)
    if candidates.numel() < k:  # the sample overestimated: rank everything
        return torch.topk(magnitudes, k, sorted=False).indices
    return candidates[torch.topk(magnitudes[candidates], k, sorted=False).indices]


class TopKCompressor(StatefulCompressor):
    """Send the ``ceil(ratio * n)`` largest-magnitude entries of each gradient
    (plus its residual); keep the rest as the residual for the next step.

    Values and int64 indices of every parameter go out in one grouped
    allgather; every rank scatter-adds all ranks' entries into the dense
    gradient (divided by the set's size for Average).
    """

    kind = "topk"

    def __init__(self, ratio: float = 0.01):
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < ratio <= 1.0:
            raise ValueError(
                f"Compression.topk: ratio must be in (0, 1], got {ratio!r} "
                "(0.01 sends 1 % of each gradient)"
            )
        self.ratio = float(ratio)
        self.residuals: dict[str, torch.Tensor] = {}

    def __repr__(self) -> str:
        return f"Compression.topk({self.ratio:g})"

    def select(self, name: str, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add *name*'s residual to *grad*, pick the top-k entries by magnitude
        and keep everything else as the new residual.  Returns (values, indices)
        into the flattened gradient; residual + sent == residual_before + grad."""
        flat = grad.detach().reshape(-1)
        residual = self.residuals.get(name)
        dtype = _work_dtype(grad.dtype)
        if residual is None or residual.shape != flat.shape or residual.dtype != dtype:
            residual = torch.zeros(flat.shape, dtype=dtype, device=grad.device)
        corrected = residual.add_(flat)  # the residual buffer now holds the corrected gradient
        k = topk_count(flat.numel(), self.ratio)
        indices = topk_indices(corrected.abs(), k)
        values = corrected[indices]
        corrected[indices] = 0  # residual = corrected - sent
        self.residuals[name] = corrected
        return values, indices

    @staticmethod
    def scatter(
        values: torch.Tensor, indices: torch.Tensor, divisor: float, out: torch.Tensor
    ) -> torch.Tensor:
        """Overwrite the flat *out* with the sum of *values* at *indices*
        (repeated indices add up), divided by *divisor*."""
        values = values.to(out.dtype)
        out.zero_()
        out.index_add_(0, indices, values if divisor == 1 else values / divisor)
        return out

    def reduce(self, grads, process_set, op) -> int:
        if not grads:
            return 0
        wires = []
        for name, grad in grads:
            wires.extend(self.select(name, grad))
        gathered = synchronize(
            grouped_allgather_async(
                wires, name=f"hvdlite.topk.{grads[0][0]}", process_set=process_set
            )
        )
        divisor = process_set.size() if op == Average else 1
        for (_, grad), values, indices in zip(grads, gathered[0::2], gathered[1::2], strict=True):
            if grad.is_contiguous():
                self.scatter(values, indices, divisor, grad.view(-1))
            else:
                _copy_into(
                    grad,
                    self.scatter(
                        values,
                        indices,
                        divisor,
                        torch.empty(grad.numel(), dtype=grad.dtype, device=grad.device),
                    ),
                )
        return sum(w.nbytes for w in wires)

    def state_dict(self) -> dict:
        return {
            "kind": self.kind,
            "ratio": self.ratio,
            "residuals": {n: r.clone() for n, r in self.residuals.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self._check_kind(state)
        self.residuals = {n: r.detach().clone() for n, r in state["residuals"].items()}


# -------------------------------------------------------------------- PowerSGD


class PowerSGDCompressor(StatefulCompressor):
    """Rank-``rank`` PowerSGD with error feedback and warm start.

    The first ``start_step`` reductions are plain allreduces.  After that,
    each gradient with 2+ dimensions is viewed as an n x m matrix M (dim 0 by
    the rest) and, when ``(n + m) * r < n * m`` (else compression would send
    more), sent as two thin factors: M += residual; P = M Q; allreduce P
    (average); orthonormalize P; Q = M^T P; allreduce Q (average); the
    gradient becomes P Q^T and the residual M - P Q^T.  Q is kept for the
    next step (warm start; initialised from a normal distribution seeded by
    ``seed`` and the parameter's name, so equal on every rank).  Other
    gradients (biases, tiny matrices) travel in the first allreduce as they
    are.  Both phases are one grouped allreduce over all parameters.
    """

    kind = "powersgd"

    def __init__(self, rank: int = 4, start_step: int = 100, seed: int = 0):
        for what, value, low in (("rank", rank, 1), ("start_step", start_step, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"Compression.powersgd: {what} must be an integer >= {low}, got {value!r}"
                )
        self.rank = rank
        self.start_step = start_step
        self.seed = int(seed)
        self.steps = 0  # reductions done so far (plain ones included)
        self.qs: dict[str, torch.Tensor] = {}
        self.residuals: dict[str, torch.Tensor] = {}
        self._pending: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name -> (M, P)

    def __repr__(self) -> str:
        return f"Compression.powersgd(rank={self.rank}, start_step={self.start_step})"

    def matrix_shape(self, shape) -> tuple[int, int] | None:
        """(n, m) when a gradient of *shape* is compressed, else None."""
        if len(shape) < 2:
            return None
        n, m = shape[0], math.prod(shape[1:])
        r = min(self.rank, n, m)
        return (n, m) if (n + m) * r < n * m else None

    def _initial_q(self, name: str, m: int, r: int, dtype) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed + zlib.crc32(name.encode()))
        return torch.randn(m, r, generator=gen, dtype=torch.float64).to(dtype)

    def project(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """Phase 1 (local): M = grad + residual; returns P = M Q (n x r) to average."""
        n, m = self.matrix_shape(grad.shape)
        r = min(self.rank, n, m)
        dtype = _work_dtype(grad.dtype)
        residual = self.residuals.get(name)
        if residual is None or residual.shape != (n, m) or residual.dtype != dtype:
            residual = torch.zeros(n, m, dtype=dtype, device=grad.device)
        matrix = residual.add_(grad.detach().reshape(n, m))  # M, in the residual's buffer
        self.residuals[name] = matrix
        q = self.qs.get(name)
        if q is None or q.shape != (m, r) or q.dtype != dtype:
            q = self._initial_q(name, m, r, dtype).to(grad.device)
        p = matrix @ q
        self._pending[name] = (matrix, p)
        return p

    def back_project(self, name: str, p_average: torch.Tensor) -> torch.Tensor:
        """Phase 2 (local): orthonormalize the averaged P (in place, so that
        *p_average* becomes the basis used in phase 3); returns Q = M^T P."""
        matrix, p = self._pending[name]
        p.copy_(torch.linalg.qr(p_average, mode="reduced").Q)
        return matrix.t() @ p

    def approximate(
        self, name: str, q_average: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Phase 3 (local): returns the approximation P Q^T (n x m) of the
        averaged M (written to *out* if given); the residual becomes M - P Q^T
        and Q is kept (warm start)."""
        matrix, p = self._pending.pop(name)
        approx = torch.mm(p, q_average.t(), out=out)
        matrix.sub_(approx)  # the residual, in M's buffer
        self.qs[name] = q_average
        return approx

    def reduce(self, grads, process_set, op) -> int:
        if not grads:
            return 0
        warm_up = self.steps < self.start_step
        self.steps += 1
        matrices = [] if warm_up else [(n, g) for n, g in grads if self.matrix_shape(g.shape)]
        compressed = {n for n, _ in matrices}
        plain = [g for n, g in grads if n not in compressed]
        wires = [g if g.is_contiguous() else g.contiguous() for g in plain]
        ps = [self.project(n, g) for n, g in matrices]
        first = grads[0][0]
        # Phase 1: every P and every plain gradient, in flight together.  P is
        # always averaged (Sum would only rescale it); plain gradients use op.
        handles = [
            grouped_allreduce_async_(
                tensors,
                name=f"hvdlite.powersgd.{what}.{first}",
                op=group_op,
                process_set=process_set,
            )
            for what, tensors, group_op in (("p", ps, Average), ("plain", wires, op))
            if tensors
        ]
        for h in handles:
            synchronize(h)
        for g, w in zip(plain, wires, strict=True):
            if w is not g:
                g.copy_(w)
        sent = sum(t.nbytes for t in ps) + sum(w.nbytes for w in wires)
        if not matrices:
            return sent
        # Phase 2: Q = M^T P for every matrix, one grouped allreduce.
        qs = [self.back_project(n, p) for (n, _), p in zip(matrices, ps, strict=True)]
        synchronize(
            grouped_allreduce_async_(
                qs, name=f"hvdlite.powersgd.q.{first}", op=Average, process_set=process_set
            )
        )
        scale = process_set.size() if op == Sum else 1
        for (name, grad), q in zip(matrices, qs, strict=True):
            if grad.is_contiguous() and grad.dtype == q.dtype:  # straight into the gradient
                self.approximate(name, q, out=grad.view(self.matrix_shape(grad.shape)))
                if scale != 1:
                    grad.mul_(scale)
            else:
                approx = self.approximate(name, q)
                _copy_into(grad, approx if scale == 1 else approx * scale)
        return sent + sum(q.nbytes for q in qs)

    def state_dict(self) -> dict:
        return {
            "kind": self.kind,
            "rank": self.rank,
            "start_step": self.start_step,
            "seed": self.seed,
            "steps": self.steps,
            "qs": {n: q.clone() for n, q in self.qs.items()},
            "residuals": {n: r.clone() for n, r in self.residuals.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self._check_kind(state)
        if state["rank"] != self.rank:
            raise ValueError(
                f"the checkpoint's PowerSGD state has rank {state['rank']}, this "
                f"compressor rank {self.rank}; use Compression.powersgd("
                f"rank={state['rank']}) to resume it"
            )
        self.steps = int(state["steps"])
        self.qs = {n: q.detach().clone() for n, q in state["qs"].items()}
        self.residuals = {n: r.detach().clone() for n, r in state["residuals"].items()}
        self._pending.clear()
