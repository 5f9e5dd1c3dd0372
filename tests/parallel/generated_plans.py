"""Plans of generated collectives, and what each rank must see when it runs one.

Not a test module: imported by test_generated_collectives.py, where the
module docstring says how the plans are drawn and run.  Everything here is a
pure function of the plan and the world size, so every rank computes the same
expectations for every rank without talking to the others.

A plan is a list of steps, each a JSON-able dict:

- ``{"type": "call", "call": C}``: one collective, sync or async.
- ``{"type": "group", "calls": [C, ...], "order": {rank: [index, ...]}}``: async
  collectives submitted together, then synchronized; a rank in *order*
  submits them in that order (an injected disagreement of order).
- ``{"type": "join", "joiners": [rank, ...], "calls": [C, ...]}``: the joiners
  call join() at once; the other ranks run *calls* (only their members that
  have not joined submit), then join.
- ``{"type": "reset", "set": index}``: every rank removes a process set and
  adds it again (dynamic sets).

A call C names its kind, grouping, in-place and sync/async spelling, process
set (an index into :func:`process_sets`), name (None: automatic), reduction
op, scale factors, root, tensors (dtype, shape, layout) with per-rank rows
where ranks may differ (allgather, alltoall), a data seed, and at most one
injected disagreement ``{"what": ..., "rank": r, ...}``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: torch dtypes by name; bool and bfloat16 included.
DTYPES = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
FLOATS = ("float16", "bfloat16", "float32", "float64")
#: Relative spacing of each float dtype (one ulp at 1.0).
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
#: The largest magnitude the generated values and results stay under, per dtype: exact
#: integers for the integer dtypes, no overflow for float16.
LIMIT = {
    "uint8": 255,
    "int8": 127,
    "int16": 32767,
    "int32": 2**31 - 1,
    "int64": 2**40,
    "float16": 2048.0,
    "bfloat16": 2.0**20,
    "float32": 2.0**20,
    "float64": 2.0**20,
}
KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
OPS = ("average", "sum", "min", "max", "product", "adasum")
BOOL_OPS = ("min", "max", "product")
SCALES = (1.0, 0.5, 2.0, 0.25, 3.0)

# Outcome classes, by name (the test maps them to hvdlite's exception classes).
OK, ARGUMENT, MISMATCH, INTERNAL = "ok", "ArgumentError", "MismatchError", "HorovodInternalError"


def process_sets(size: int) -> list[tuple[int, ...]]:
    """The process sets the plans use: index 0 is the global set."""
    if size == 2:
        return [(0, 1), (0,), (1,)]
    return [(0, 1, 2), (0, 1), (1, 2), (0, 2), (1,)]


def is_reduction(kind: str) -> bool:
    return kind in ("allreduce", "reducescatter")


# ------------------------------------------------------------------ per-rank view
def localize(call: dict, rank: int) -> dict | None:
    """*call* as *rank* makes it: its injected disagreement applied; None when the
    rank skips it."""
    inject = call.get("inject")
    if not inject or inject["rank"] != rank:
        return call
    what = inject["what"]
    if what == "skip":
        return None
    mine = dict(call)
    mine["inject"] = None
    tensors = [dict(t) for t in call["tensors"]]
    if what == "shape":
        tensors[0]["shape"] = inject["shape"]
    elif what == "count":
        tensors = tensors[:-1]
    elif what == "dtype":
        tensors[0]["dtype"] = inject["dtype"]
    elif what in ("op", "root", "pre", "post"):
        mine[what] = inject["value"]
    elif what == "name":
        mine["name"] = call["name"] + ".other"
    mine["tensors"] = tensors
    return mine


def family(kind: str) -> str:
    """The automatic-name counter (and explicit-name prefix) a kind uses."""
    return kind


def shape_on(call: dict, t: dict, rank: int) -> tuple[int, ...]:
    """Tensor *t*'s full shape on *rank* (dim 0 may differ for allgather, alltoall)."""
    shape = tuple(t["shape"])
    rows = t.get("rows")
    if rows is not None and shape:
        return (rows[str(rank)],) + shape[1:]
    return shape


def splits_on(call: dict, rank: int):
    splits = call.get("splits")
    return None if splits is None else splits[str(rank)]


def values(call: dict, index: int, rank: int, dtype: str, shape) -> np.ndarray:
    """Rank *rank*'s values of tensor *index* of *call*, as float64 (ints exact),
    or bool: small dyadic numbers, so that sums are exact in any order and every
    value is exact in float16 and bfloat16."""
    rng = np.random.default_rng([call["seed"], rank, call["id"], index])
    shape = tuple(shape)
    if dtype == "bool":
        return np.asarray(rng.integers(0, 2, size=shape)).astype(bool)
    bound = value_bound(call, dtype)
    if dtype in FLOATS:
        return np.asarray(rng.integers(-4 * bound, 4 * bound + 1, size=shape)) / 4.0
    low = 0 if dtype == "uint8" else -bound
    return np.asarray(rng.integers(low, bound + 1, size=shape)).astype(np.float64)


def value_bound(call: dict, dtype: str) -> int:
    """The largest |value| of *dtype* whose reduction (any rank count up to 3, any
    scale factors of the call or an injected one) stays exact and in range."""
    top = max(SCALES)
    if call.get("op") == "product":  # (value * prescale) ** 3 * postscale
        bound = int(math.floor((LIMIT[dtype] / top) ** (1.0 / 3.0) / top))
    else:  # three values * prescale * postscale
        bound = int(LIMIT[dtype] / 3.0 / top / top)
    cap = 64 if dtype == "bfloat16" else 1000
    return max(1, min(bound, cap))


# ----------------------------------------------------------------- local checks
def contiguous(t: dict, shape) -> bool:
    """Whether the tensor of layout t["layout"] and *shape* is contiguous in torch."""
    if math.prod(shape) == 0 or t["layout"] == "c":
        return True
    if t["layout"] == "t":
        return len(shape) < 2 or shape[-1] == 1 or shape[-2] == 1
    return len(shape) < 1 or shape[0] <= 1  # "s": every other row along dim 0


def local_error(call: dict, rank: int, sets) -> bool:
    """Whether hvdlite must refuse *call* on *rank* at submission (ArgumentError)."""
    kind, members = call["kind"], sets[call["set"]]
    n = len(members)
    for t in call["tensors"]:
        shape = shape_on(call, t, rank)
        if call["inplace"] and not contiguous(t, shape):
            return True
        if kind in ("allgather", "alltoall", "reducescatter") and len(shape) == 0:
            return True
        if is_reduction(kind) and t["dtype"] == "bool" and call["op"] not in BOOL_OPS:
            return True
    if is_reduction(kind) and call["op"] == "adasum" and (n & (n - 1) or kind != "allreduce"):
        return True
    if kind == "broadcast" and call["root"] not in members:
        return True
    if kind == "alltoall" and call.get("splits") is None:
        return shape_on(call, call["tensors"][0], rank)[0] % n != 0
    return False


# ----------------------------------------------------------------- expectations
def engine_params(call: dict, rank: int) -> tuple:
    """What the ranks must agree on (Horovod's rule: the framework dtype, the
    shape, less dim 0 where ranks may differ, op, root, scale factors)."""
    kind = call["kind"]
    shapes = []
    for t in call["tensors"]:
        shape = shape_on(call, t, rank)
        shapes.append((t["dtype"], shape[1:] if kind in ("allgather", "alltoall") else shape))
    extra = ()
    if is_reduction(kind):
        extra = (call["op"], call["pre"], call["post"])
    elif kind == "broadcast":
        extra = (call["root"],)
    # Not whether it is grouped: a group of one tensor pairs with a plain call.
    return (kind, tuple(shapes), extra)


def expect_calls(calls_by_rank: dict, sets, joined=frozenset()) -> dict:
    """Expected outcome of each (rank, call id) for collectives submitted in one step.

    *calls_by_rank*: rank -> its localized calls in submission order.  Returns
    {(rank, id): (outcome, reference or None)} where reference is the list of
    expected arrays (numpy; alltoall adds the received splits).  *joined*: the
    ranks inside join(), which add zeros to allreduces and fail the other kinds."""
    expected, keys = {}, {}
    for rank, calls in calls_by_rank.items():
        auto = {}
        for call in calls:
            if local_error(call, rank, sets):
                expected[(rank, call["id"])] = (ARGUMENT, None)
                continue
            fam = (family(call["kind"]), call["set"])
            if call["name"] is None:
                k = auto.get(fam, 0)
                auto[fam] = k + 1
                key = fam + ("auto", k)
            else:
                key = fam + ("named", call["name"])
            keys.setdefault(key, {})[rank] = call
    for by_rank in keys.values():
        some = next(iter(by_rank.values()))
        members = sets[some["set"]]
        live = [r for r in members if r not in joined]
        if joined & set(members) and some["kind"] != "allreduce":
            outcome = (MISMATCH, None)  # only allreduce runs beside a join
            for rank, call in by_rank.items():
                expected[(rank, call["id"])] = outcome
            continue
        if sorted(by_rank) != live:  # a rank skipped it, or named it otherwise: a stall
            for rank, call in by_rank.items():
                expected[(rank, call["id"])] = (INTERNAL, None)
            continue
        params = {rank: engine_params(call, rank) for rank, call in by_rank.items()}
        if len(set(params.values())) > 1:
            for rank, call in by_rank.items():
                expected[(rank, call["id"])] = (MISMATCH, None)
            continue
        for rank, call in by_rank.items():
            expected[(rank, call["id"])] = (OK, reference(by_rank, rank, members, joined))
    return expected


def inputs(call: dict, rank: int) -> list[np.ndarray]:
    return [
        values(call, i, rank, t["dtype"], shape_on(call, t, rank))
        for i, t in enumerate(call["tensors"])
    ]


def reference(by_rank: dict, rank: int, members, joined) -> list:
    """What *rank* receives from the collective its peers ran as *by_rank*."""
    call = by_rank[rank]
    kind, n = call["kind"], len(members)
    data = {r: inputs(by_rank[r], r) for r in by_rank}
    if kind == "broadcast":
        return data[call["root"]]
    if kind == "allgather":
        return [
            np.concatenate([data[r][i] for r in members], axis=0)
            for i in range(len(call["tensors"]))
        ]
    if kind == "alltoall":
        me = members.index(rank)
        rows, received = [], []
        for r in members:
            x = data[r][0]
            splits = splits_on(by_rank[r], r) or [x.shape[0] // n] * n
            start = sum(splits[:me])
            rows.append(x[start : start + splits[me]])
            received.append(splits[me])
        return [np.concatenate(rows, axis=0), np.array(received)]
    out = []
    for i, t in enumerate(call["tensors"]):
        shape = shape_on(call, t, rank)
        parts = [np.zeros(shape) if r in joined else data[r][i].astype(np.float64) for r in members]
        full = reduce(parts, t["dtype"], call["op"], call["pre"], call["post"], n)
        if kind == "reducescatter":
            counts = [shape[0] // n + (1 if j < shape[0] % n else 0) for j in range(n)]
            start = sum(counts[: members.index(rank)])
            full = full[start : start + counts[members.index(rank)]]
        out.append(full)
    return out


def reduce(parts, dtype: str, op: str, pre: float, post: float, n: int) -> np.ndarray:
    """hvdlite's documented reduction of *parts* (float64 values of *dtype*):
    integers scaled in float64 and truncated, before the sum (prescale) and
    after it (postscale, divided by the set's size for Average); floats in
    their wire precision, rounded once to the dtype by the caller's comparison;
    bool as logical and/or."""
    if dtype == "bool":
        stacked = np.stack([p.astype(bool) for p in parts])
        return stacked.any(axis=0) if op == "max" else stacked.all(axis=0)
    integer = dtype not in FLOATS
    scaled = [np.trunc(p * pre) if integer and pre != 1.0 else p * pre for p in parts]
    if op == "adasum":
        flat = adasum([s.reshape(-1) for s in scaled]).reshape(parts[0].shape)
        return flat * post
    stacked = np.stack(scaled)
    if op in ("sum", "average"):
        red = stacked.sum(axis=0)
    elif op == "min":
        red = stacked.min(axis=0)
    elif op == "max":
        red = stacked.max(axis=0)
    else:
        red = stacked.prod(axis=0)
    factor = post / n if op == "average" else post
    if factor == 1.0:
        return red
    return np.trunc(red * factor) if integer else red * factor


def adasum(vectors: list) -> np.ndarray:
    """Adasum over a power-of-two number of vectors, as a binary tree."""
    while len(vectors) > 1:
        vectors = [_combine(a, b) for a, b in zip(vectors[::2], vectors[1::2])]
    return vectors[0]


def _combine(a, b):
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - dot / (2.0 * aa) if aa > 0 else 1.0
    cb = 1.0 - dot / (2.0 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def tolerance(dtype: str, reference: np.ndarray, op: str | None, parts_norm: float) -> np.ndarray:
    """Elementwise allowed |error| for a float result: one rounding to the dtype
    (the wire's rounding of the postscale, then the cast back), plus, for
    Adasum, float64 rounding of its dot products."""
    eps = EPS[dtype]
    tol = 2.0 * eps * np.abs(reference) + 2.0**-24
    if op == "adasum":
        tol = tol + 1e-9 * parts_norm + eps * parts_norm
    return tol


# -------------------------------------------------------------------- strategies
#: Explicit names are drawn from a small pool, so that steps and sequences reuse
#: them (the response cache's path, with shapes and dtypes that change).
NAMES = ("a", "b", "w.0", "grad/1")
#: Injected disagreements; "skip" and "name" stall until the stall shutdown (seconds
#: each), so they are drawn less often.
INJECTIONS = ("shape", "dtype", "op", "root", "pre", "post", "count") * 3 + ("skip", "name")


def draw_call(draw, st, size: int, ident: int, *, mode=None, inject=True, allreduce_only=False):
    """One generated call (see the module docstring)."""
    sets = process_sets(size)
    kind = "allreduce" if allreduce_only else draw(st.sampled_from(KINDS))
    set_index = draw(st.integers(0, len(sets) - 1))
    members = sets[set_index]
    n = len(members)
    grouped = kind in ("allreduce", "allgather", "reducescatter") and draw(st.booleans())
    inplace = kind in ("allreduce", "broadcast") and draw(st.booleans())
    valid = draw(st.integers(0, 9)) > 0
    call = {
        "id": ident,
        "kind": kind,
        "grouped": grouped,
        "inplace": inplace,
        "mode": mode or draw(st.sampled_from(("sync", "async"))),
        "set": set_index,
        "name": draw(st.one_of(st.none(), st.sampled_from(NAMES))),
        "seed": draw(st.integers(0, 2**16)),
        "inject": None,
    }
    if is_reduction(kind):
        # Mostly valid calls; now and then one that every rank must refuse.
        ops = [o for o in OPS if o != "adasum" or (kind == "allreduce" and not n & (n - 1))]
        call["op"] = draw(st.sampled_from(ops if valid else OPS))
    ndim = draw(st.integers(0, 3))
    if kind in ("allgather", "alltoall", "reducescatter") and valid:
        ndim = max(ndim, 1)
    shape = [draw(st.integers(0, 4)) for _ in range(ndim)]
    tensors = []
    for _ in range(draw(st.integers(1, 3)) if grouped else 1):
        if call.get("op") == "adasum":
            dtype = draw(st.sampled_from(FLOATS))
        elif is_reduction(kind) and call["op"] not in BOOL_OPS and valid:
            dtype = draw(st.sampled_from(tuple(d for d in DTYPES if d != "bool")))
        else:
            dtype = draw(st.sampled_from(tuple(DTYPES)))
        layouts = "c" if inplace and valid else "cts"
        tensor = {"dtype": dtype, "shape": list(shape), "layout": draw(st.sampled_from(layouts))}
        if kind == "allgather" and ndim:
            tensor["rows"] = {str(r): draw(st.integers(0, 3)) for r in members}
        tensors.append(tensor)
        if draw(st.booleans()):  # the next tensor of a group takes another shape
            shape = [draw(st.integers(0, 4)) for _ in range(ndim)]
    call["tensors"] = tensors
    if kind == "alltoall" and ndim:
        if draw(st.booleans()):
            splits = {str(r): [draw(st.integers(0, 3)) for _ in members] for r in members}
            call["splits"] = splits
            tensors[0]["rows"] = {r: sum(s) for r, s in splits.items()}
        else:
            tensors[0]["rows"] = {str(r): n * draw(st.integers(0, 2)) for r in members}
    if is_reduction(kind):
        plain = any(t["dtype"] == "bool" for t in tensors)
        call["pre"] = 1.0 if plain else draw(st.sampled_from(SCALES))
        call["post"] = 1.0 if plain else draw(st.sampled_from(SCALES))
    if kind == "broadcast":
        call["root"] = draw(st.sampled_from(members))
    if inject and n > 1 and draw(st.integers(0, 3)) == 0:
        call["inject"] = draw_injection(draw, st, call, members)
    return settle(call, sets)


def draw_injection(draw, st, call: dict, members) -> dict | None:
    """One disagreement of one member of the call's set, where the call allows it."""
    what = draw(st.sampled_from(INJECTIONS))
    rank = draw(st.sampled_from(members))
    t0 = call["tensors"][0]
    if what == "shape":
        shape = list(t0["shape"])
        if len(shape) >= 2 or (shape and call["kind"] not in ("allgather", "alltoall")):
            shape[-1] += 1
        else:
            shape = shape + [2]
        return {"what": what, "rank": rank, "shape": shape}
    if what == "dtype":
        others = [d for d in DTYPES if d != t0["dtype"]]
        return {"what": what, "rank": rank, "dtype": draw(st.sampled_from(others))}
    if what == "op" and is_reduction(call["kind"]):
        others = [o for o in OPS if o != call["op"]]
        return {"what": what, "rank": rank, "value": draw(st.sampled_from(others))}
    if what in ("pre", "post") and is_reduction(call["kind"]):
        others = [s for s in SCALES if s != call[what]]
        return {"what": what, "rank": rank, "value": draw(st.sampled_from(others))}
    if what == "root" and call["kind"] == "broadcast":
        others = [r for r in members if r != call["root"]]
        return {"what": what, "rank": rank, "value": draw(st.sampled_from(others))}
    if what == "count" and len(call["tensors"]) > 1:
        return {"what": what, "rank": rank}
    if what in ("skip", "name"):
        return {"what": what, "rank": rank}
    return None


def settle(call: dict, sets) -> dict:
    """Name *call* where some members would submit it and others not (a skip, a
    refused argument on one rank): an unnamed call would then move the automatic
    names of those ranks out of step for good, which is the documented contract,
    not something to test at every later call.  A name disagreement needs a name."""
    inject = call["inject"]
    if call["name"] is None and inject and inject["what"] in ("name", "skip"):
        call["name"] = f"n{call['id']}"
    submits = set()
    for r in sets[call["set"]]:
        mine = localize(call, r)
        submits.add(mine is not None and not local_error(mine, r, sets))
    if call["name"] is None and len(submits) > 1:
        call["name"] = f"n{call['id']}"
    return call


def draw_plan(draw, st, size: int, max_steps: int) -> list:
    """A sequence of steps (see the module docstring)."""
    sets = process_sets(size)
    steps, ident = [], 0
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(("call",) * 6 + ("group",) * 3 + ("join",) * 2 + ("reset",)))
        if kind == "call":
            steps.append({"type": "call", "call": draw_call(draw, st, size, ident)})
            ident += 1
        elif kind == "group":
            calls = []
            for _ in range(draw(st.integers(2, 4))):
                calls.append(draw_call(draw, st, size, ident, mode="async"))
                ident += 1
            distinct_names(calls)
            order = {}
            if draw(st.integers(0, 2)) == 0:  # one rank submits them in another order
                rank = draw(st.integers(0, size - 1))
                order[str(rank)] = draw(st.permutations(range(len(calls))))
                for call in calls:  # unnamed, they would pair up otherwise: user error
                    if call["name"] is None:
                        call["name"] = f"n{call['id']}"
            steps.append({"type": "group", "calls": calls, "order": order})
        elif kind == "join":
            joiners = [r for r in range(size) if draw(st.booleans())] or [0]
            calls = []
            for _ in range(draw(st.integers(0, 3))):
                only_allreduce = draw(st.integers(0, 3)) > 0
                call = draw_call(draw, st, size, ident, inject=False, allreduce_only=only_allreduce)
                members = sets[call["set"]]
                if call["name"] is None and set(members) & set(joiners):
                    call["name"] = f"n{ident}"  # joined ranks do not count it
                calls.append(call)
                ident += 1
            distinct_names(calls)
            steps.append({"type": "join", "joiners": joiners, "calls": calls})
        else:
            steps.append({"type": "reset", "set": draw(st.integers(1, len(sets) - 1))})
    return steps


def distinct_names(calls: list) -> None:
    """No two calls of one step share a kind and an explicit name (that would be a
    duplicate name in flight, refused on the calling rank)."""
    seen = set()
    for call in calls:
        if call["name"] is None:
            continue
        while (call["kind"], call["name"]) in seen:
            call["name"] = f"{call['name']}.{call['id']}"
        seen.add((call["kind"], call["name"]))
