"""FLOPs and HBM bytes per device of a compiled program, per stage, from its HLO text.

XLA's own cost analysis (`Compiled.cost_analysis()`) counts a while loop's body once, whatever
its trip count; a round is loops within loops (layers scanned, tokens decoded one at a time,
micro-batches), so it undercounts by orders of magnitude. This walks the optimised HLO instead
and multiplies each loop's body by its trip count (XLA's `known_trip_count` where it writes
one; else read from the loop's condition, `counter < limit`), counting what XLA's analysis
counts per instruction: 2 FLOPs per multiply-add of a dot or convolution,
one per element of arithmetic ops; HBM bytes as each kernel's operands and results, where a
dynamic slice reads only its slice and a dynamic update writes only its update (a layer's
weights out of the stacked layers, a token into the KV cache), and buffers the TPU compiler
placed in on-chip memory (an `S(1)` layout: weights prefetched by an asynchronous copy) count
only once, as the copy's read from HBM. Loops whose trip count cannot be
read are counted once and reported (`unknown_loops`); a decode loop, which may stop early once
every row has finished, is counted at its bound; a conditional's branches are all counted.

On GPU, XLA hands matmuls to libraries as custom calls (`__cublas$gemm`,
`__cublas$lt$matmul[$f8]`), counted as the dot they stand for: 2 x the result's elements x the
contracted size, read from the call's `dot_dimension_numbers` (batch dimensions are in the
result). cuDNN's fused attention (`__cudnn$fmha*`) is counted from its shapes: with S the
scores' shape `intermediate_tensor_shape` (batch x heads x Tq x Tk), d the head size of the
queries (|Q| / (batch x heads x Tq)) and dv the values' (d x |V| / |K|), the forward is two
matmuls, 2 x |S| x (d + dv); the backward five, recomputing the scores and forming the four
gradients' products, 2 x |S| x (3d + 2dv). A causal mask keeps the pairs of its upper-left
triangle, sum over i < Tq of min(i + 1, Tk), of the Tq x Tk (the blocks cuDNN skips are not
done); other masks (padding, a sliding window) are counted whole. Their bytes are their
operands and results, less the library's scratch buffer (the last `s8`/`u8` of the result).
Other custom calls count their bytes only.

Pallas splash attention kernels (`models.attention.splash`, TPU custom calls) are opaque to
the walk: their matmuls are counted from their q and k shapes over the (query, key) tiles the
kernel computes, the share of the square its static mask leaves (it skips the empty tiles:
about half of a causal square, more under shared-prefix branches), which the model code
records on the name scope of the kernel's mask constants (`splash_share`).

Instructions are attributed to the stage whose `jax.named_scope` (`compile.ScopedStages`) is in
their `op_name`, else to the stage of the loop, call or fusion that holds them, else `other`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
               "s4": 0.5, "u4": 0.5, "f8e4m3fn": 1, "f8e5m2": 1, "token": 0}
# An array type and its layout, if written: `bf16[128,1024]{1,0:T(8,128)(2,1)S(1)}`; `S(n)`,
# n >= 1, places it in an alternate memory space (TPU memory-space assignment: on-chip
# memory), not HBM.
SHAPE = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
ON_CHIP = re.compile(r"S\([1-9]\d*\)")
INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
CALLS = re.compile(r"\b(calls|body|condition|to_apply|true_computation|false_computation)="
                   r"%?([\w.\-]+)")
BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
OP_NAME = re.compile(r'op_name="([^"]*)"')
ARITHMETIC = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs",
              "compare", "select", "and", "or", "xor", "not", "remainder", "clamp", "sign",
              "floor", "ceil", "round-nearest-even", "round-nearest-afz"}
FLOATS = ("bf16", "f16", "f32")
# Matmuls of `2 x T x S x D` FLOPs per head in each splash kernel: the forward computes QK^T
# and PV; dq recomputes QK^T, then dP and dQ; dkv recomputes QK^T, then dV, dP and dK.
SPLASH = re.compile(r"splash_m[hq]a_(fwd|dq|dkv)")
SPLASH_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}
SPLASH_SHARE = re.compile(r'op_name="[^"]*splash_tiles_([\d.]+)')
FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
        "conditional", "call", "after-all", "partition-id", "replica-id", "opt-barrier",
        "iota", "all-gather-done", "all-reduce-done", "collective-permute-done", "async-done",
        "copy-done", "send-done", "recv-done", "add-dependency"}


class Cost(NamedTuple):
    """FLOPs and HBM bytes per device."""

    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: Cost) -> Cost:  # type: ignore[override]
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def times(self, n: float) -> Cost:
        return Cost(self.flops * n, self.bytes * n)


class Instruction(NamedTuple):
    name: str
    shape: str  # the result type
    opcode: str
    operands: str
    attributes: str


def _split_type(text: str) -> tuple[str, str]:
    """`(f32[2], s32[]) add(...)` -> the type and the rest."""
    if not text.startswith("("):
        head, _, rest = text.partition(" ")
        return head, rest
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return text[:i + 1], text[i + 1:].lstrip()
    return text, ""


def _parse(line: str) -> Instruction | None:
    match = INSTRUCTION.match(line)
    if not match:
        return None
    name, rest = match.groups()
    shape, rest = _split_type(rest)
    opcode, paren, rest = rest.partition("(")
    if not paren:
        return None
    depth = 1
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return Instruction(name, shape, opcode.strip(), rest[:i], rest[i + 1:])
    return Instruction(name, shape, opcode.strip(), rest, "")


def parse_module(text: str) -> tuple[dict[str, list[Instruction]], str]:
    """Computations by name (instructions in order) and the entry computation's name."""
    computations: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = HEADER.match(line)
        if header:
            current = header.group(2)
            computations[current] = []
            entry = current if header.group(1) else entry
        elif line.strip() == "}":
            current = None
        elif current is not None:
            instruction = _parse(line)
            if instruction is not None:
                computations[current].append(instruction)
    return computations, entry


def _shapes(text: str, hbm_only: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    """The array types written in `text`, (dtype, dims); `hbm_only`: those not placed in
    on-chip memory."""
    return [(d, tuple(int(x) for x in dims.split(",") if x))
            for d, dims, layout in SHAPE.findall(text)
            if d in DTYPE_BYTES and not (hbm_only and ON_CHIP.search(layout))]


def nbytes(text: str) -> float:
    """Bytes of every array type written in `text` (a tuple's elements summed)."""
    return sum(DTYPE_BYTES[d] * math.prod(dims) for d, dims in _shapes(text))


def hbm_bytes(text: str) -> float:
    """Bytes of the array types in `text` that live in HBM (not in an alternate memory space,
    where the TPU compiler prefetches what a kernel reads next: reading or writing those is no
    HBM traffic)."""
    return sum(DTYPE_BYTES[d] * math.prod(dims) for d, dims in _shapes(text, hbm_only=True))


def elements(text: str) -> int:
    return sum(math.prod(dims) for _, dims in _shapes(text))


def _dims(attributes: str, key: str) -> list[int]:
    match = re.search(key + r"=\{([0-9,]*)\}", attributes)
    return [int(x) for x in match.group(1).split(",") if x] if match else []


def _operand_names(ins: Instruction) -> list[str]:
    return re.findall(r"%([\w.\-]+)", ins.operands)


def _config_dims(attributes: str, key: str) -> list[int]:
    """A dimension list of a custom call's JSON backend config (`"key":["1","2"]`)."""
    match = re.search(rf'"{key}":\s*\[([^\]]*)\]', attributes)
    return [int(x) for x in re.findall(r"\d+", match.group(1))] if match else []


def _library_result(ins: Instruction) -> list[tuple[str, tuple[int, ...]]]:
    """A cuBLAS or cuDNN call's result arrays, less its scratch buffer (a trailing s8/u8)."""
    arrays = _shapes(ins.shape)
    return arrays[:-1] if len(arrays) > 1 and arrays[-1][0] in ("s8", "u8") else arrays


def causal_pairs(queries: int, keys: int) -> int:
    """The (query, key) pairs a causal mask keeps, aligned to the upper left: query i sees
    keys 0..i."""
    full = min(queries, keys)  # queries 0..full-1 see i + 1 keys, the rest see all keys
    return full * (full + 1) // 2 + (queries - full) * keys


def _attention_flops(ins: Instruction, operands: list[str], backward: bool) -> float:
    """cuDNN fused attention's FLOPs from its shapes (module docstring)."""
    match = re.search(r'"intermediate_tensor_shape":\s*\{[^{}]*?"dimensions":\s*\[([^\]]*)\]',
                      ins.attributes)
    scores = [int(x) for x in re.findall(r"\d+", match.group(1))] if match else []
    q, k, v = (elements(t) for t in operands[:3])
    if len(scores) < 2 or not k:
        return 0.0
    rows, tq, tk = math.prod(scores[:-2]), scores[-2], scores[-1]
    d = q / (rows * tq)
    dv = d * v / k
    mask = re.search(r'"mask_type":\s*"(\w+)"', ins.attributes)
    pairs = (causal_pairs(tq, tk) if mask and mask.group(1) in ("CAUSAL", "PADDING_CAUSAL")
             else tq * tk)
    return 2.0 * rows * pairs * ((3 * d + 2 * dv) if backward else (d + dv))


def _custom_call_flops(ins: Instruction, operands: list[str], share: float) -> float:
    """FLOPs of a cuBLAS gemm, cuDNN fused attention or a splash attention kernel (`share`:
    the share of the score tiles it computes); 0 for other custom calls."""
    kernel = SPLASH.match(ins.name)
    if kernel:  # q [..., heads, T, D] and k [..., kv_heads, S, D], the first two float operands
        q, k = [dims for t in operands for d, dims in _shapes(t)[:1] if d in FLOATS][:2]
        return share * 2.0 * SPLASH_MATMULS[kernel.group(1)] * math.prod(q[:-1]) * k[-2] * q[-1]
    target = re.search(r'custom_call_target="([^"]*)"', ins.attributes)
    target = target.group(1) if target else ""
    if re.fullmatch(r"__cublas\$(gemm|lt\$matmul(\$f8)?)", target):
        lhs = _shapes(operands[0])[0][1]
        contracted = math.prod(lhs[i] for i in _config_dims(ins.attributes,
                                                              "lhs_contracting_dimensions"))
        return 2.0 * math.prod(_library_result(ins)[0][1]) * contracted
    if target.startswith("__cudnn$fmha"):
        return _attention_flops(ins, operands, "Backward" in target)
    return 0.0


def _flops(ins: Instruction, types: Mapping[str, str], share: float = 1.0) -> float:
    """FLOPs of one instruction as XLA's cost analysis counts them (`share`: a splash
    kernel's, `splash_share`)."""
    operands = [types.get(n, "") for n in _operand_names(ins)]
    if ins.opcode == "custom-call":
        return _custom_call_flops(ins, operands, share)
    if ins.opcode == "dot":
        lhs = _shapes(operands[0])[0][1]
        return 2.0 * elements(ins.shape) * math.prod(lhs[i] for i in _dims(ins.attributes,
                                                                           "lhs_contracting_dims"))
    if ins.opcode == "convolution":
        return _convolution_flops(ins, _shapes(operands[0])[0][1], _shapes(operands[1])[0][1])
    if ins.opcode in ARITHMETIC:
        return float(elements(ins.shape))
    if ins.opcode in ("reduce", "reduce-window"):
        return float(elements(operands[0]))
    return 0.0


def splash_share(ins: Instruction, instructions: Mapping[str, Instruction]) -> float:
    """The share of score tiles a splash kernel computes, as `models.attention.splash`
    recorded it on the name scope of the kernel's inputs (its mask's constants, reached
    through copies); 1.0, the whole square, when none is found."""
    todo, seen = _operand_names(ins), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in instructions:
            continue
        seen.add(name)
        found = SPLASH_SHARE.search(instructions[name].attributes)
        if found:
            return float(found.group(1))
        if instructions[name].opcode in ("copy-done", "copy-start", "copy", "bitcast"):
            todo += _operand_names(instructions[name])
    return 1.0


def _window_pairs(size: int, out: int, window: int, pad: int, stride: int, lhs_dilation: int,
                  rhs_dilation: int) -> int:
    """(output, kernel) position pairs of one spatial dimension that land on the input, not
    on padding or dilation holes."""
    extent = (size - 1) * lhs_dilation + 1
    return sum(1 for o in range(out) for k in range(window)
               if 0 <= (x := o * stride + k * rhs_dilation - pad) < extent
               and x % lhs_dilation == 0)


def _convolution_flops(ins: Instruction, lhs: tuple[int, ...], rhs: tuple[int, ...]) -> float:
    """2 x multiply-adds, counting for each spatial dimension only the kernel positions on the
    input (XLA writes dots with batch dimensions as padded windows: most positions are on
    padding)."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.attributes)
    out = _shapes(ins.shape)[0][1]
    if labels is None:
        return 2.0 * math.prod(out) * math.prod(rhs)
    lhs_labels, rhs_labels, out_labels = labels.groups()
    window = re.search(r"window=\{([^}]*)\}", ins.attributes)
    fields = dict(f.split("=", 1) for f in window.group(1).split()) if window else {}
    spatial = sorted(c for c in lhs_labels if c.isdigit())

    def field(name: str, default: int) -> list[int]:
        if name not in fields:
            return [default] * len(spatial)
        return [int(x) for x in fields[name].split("x")]

    pads = ([int(p.split("_")[0]) for p in fields["pad"].split("x")] if "pad" in fields
            else [0] * len(spatial))
    sizes, strides = field("size", 1), field("stride", 1)
    lhs_dilate, rhs_dilate = field("lhs_dilate", 1), field("rhs_dilate", 1)
    pairs = 1
    for i, d in enumerate(spatial):
        pairs *= _window_pairs(lhs[lhs_labels.index(d)], out[out_labels.index(d)], sizes[i],
                               pads[i], strides[i], lhs_dilate[i], rhs_dilate[i])
    per_window = math.prod(out) // max(1, math.prod(out[out_labels.index(d)] for d in spatial))
    return 2.0 * per_window * rhs[rhs_labels.index("i")] * pairs


def _fusion_bytes(ins: Instruction, body: list[Instruction], types: Mapping[str, str]
                  ) -> float:
    """A fused kernel's HBM traffic: each operand read whole, except one only sliced (read
    its slices) or updated in place (not read); the result written whole, except an in-place
    update (write the update)."""
    params = {int(re.search(r"\d+", i.operands).group()): i.name for i in body
              if i.opcode == "parameter"}
    users: dict[str, list[Instruction]] = {}
    for i in body:
        for name in _operand_names(i):
            users.setdefault(name, []).append(i)
    operand_types = [types.get(n, "") for n in _operand_names(ins)]
    total = 0.0
    for index, type_text in enumerate(operand_types):
        uses = users.get(params.get(index, ""), [])
        if uses and all(u.opcode in ("dynamic-slice", "slice", "gather")
                        and _operand_names(u)[0] == params[index] for u in uses):
            total += sum(hbm_bytes(u.shape) for u in uses)
        elif uses and all(u.opcode == "dynamic-update-slice"
                          and _operand_names(u)[0] == params[index] for u in uses):
            continue
        else:
            total += hbm_bytes(type_text)
    root = body[-1] if body else None
    by_name = {i.name: i for i in body}
    outputs = ([by_name.get(n) for n in _operand_names(root)] if root and root.opcode == "tuple"
               else [root])
    for out in outputs:
        if out is not None and out.opcode == "dynamic-update-slice":
            total += hbm_bytes(types.get(_operand_names(out)[1], ""))
        elif out is not None:
            total += hbm_bytes(out.shape)
    return total


def _bytes(ins: Instruction, types: Mapping[str, str]) -> float:
    """HBM traffic of one unfused instruction."""
    if ins.opcode in FREE:
        return 0.0
    operands = [types.get(n, "") for n in _operand_names(ins)]
    if ins.opcode == "dynamic-slice":
        return 2.0 * hbm_bytes(ins.shape)
    if ins.opcode == "dynamic-update-slice":
        return 2.0 * hbm_bytes(operands[1])
    if ins.opcode == "copy-start":  # (destination, source, context): the copy moves it once
        return sum(hbm_bytes(t) for t in operands) + hbm_bytes(ins.shape.split(", ")[0])
    if ins.opcode == "custom-call" and re.search(r'custom_call_target="__cu(blas|dnn)\$',
                                                 ins.attributes):
        return sum(hbm_bytes(t) for t in operands) + sum(
            DTYPE_BYTES[d] * math.prod(dims) for d, dims in _library_result(ins))
    return sum(hbm_bytes(t) for t in operands) + hbm_bytes(ins.shape)


def _stage(ins: Instruction, stages: Iterable[str], instructions: Mapping[str, Instruction]
           ) -> str | None:
    """The stage `ins`'s op_name names. An instruction without an op_name (a Pallas kernel's
    custom call) takes the first stage its operands' op_names name, constants aside (XLA
    shares one constant between stages that both use it)."""
    match = OP_NAME.search(ins.attributes)
    if match is None:
        producers = (instructions.get(n) for n in _operand_names(ins))
        return next((s for p in producers if p is not None and p.opcode != "constant"
                     and OP_NAME.search(p.attributes)
                     and (s := _stage(p, stages, instructions))), None)
    parts = match.group(1).split("/")
    return next((s for s in stages if s in parts), None)


def _constant(ins: Instruction | None) -> int | None:
    if ins is None or ins.opcode != "constant" or not re.fullmatch(r"-?\d+", ins.operands):
        return None
    return int(ins.operands)


def _compares(condition: str, computations: Mapping[str, list[Instruction]],
              instructions: Mapping[str, Instruction]
              ) -> Iterable[tuple[Instruction, Instruction | None, Instruction | None]]:
    """A loop condition's comparisons and their two operands, also those fused into a kernel
    of the condition (XLA:GPU fuses `counter < limit` with the early exit): a fused
    computation's parameter stands for the fusion's operand."""
    for ins in computations.get(condition, []):
        if ins.opcode == "compare":
            yield (ins, *(instructions.get(n) for n in _operand_names(ins)[:2]))
        elif ins.opcode == "fusion":
            body = computations.get(dict(CALLS.findall(ins.attributes)).get("calls", ""), [])
            outer = _operand_names(ins)
            local = {i.name: i for i in body}

            def resolve(name: str) -> Instruction | None:
                i = local.get(name)
                if i is not None and i.opcode == "parameter":
                    return instructions.get(outer[int(i.operands)])
                return i

            for i in body:
                if i.opcode == "compare":
                    yield (i, *(resolve(n) for n in _operand_names(i)[:2]))


def trip_count(loop: Instruction, condition: str, computations: Mapping[str, list[Instruction]],
               instructions: Mapping[str, Instruction]) -> int | None:
    """A while loop's trip count: XLA's `known_trip_count` annotation, else read from its
    condition `counter < limit` (a counter in the loop state, a constant limit; the counter
    starts at its constant initial value, else 0), the bound of a loop that may also exit
    early (decoding stops once every row has finished). None when neither is there."""
    known = TRIP_COUNT.search(loop.attributes)
    if known:
        return int(known.group(1))
    for ins, a, b in _compares(condition, computations, instructions):
        direction = re.search(r"direction=(\w+)", ins.attributes)
        direction = direction.group(1) if direction else ""
        if _constant(a) is not None and direction in ("GT", "GE"):
            a, b, direction = b, a, {"GT": "LT", "GE": "LE"}[direction]
        limit = _constant(b)
        if limit is None or a is None or a.opcode != "get-tuple-element" or direction not in (
                "LT", "LE"):
            continue
        index = int(re.search(r"index=(\d+)", a.attributes).group(1))
        init = instructions.get(_operand_names(loop)[0])
        start = None
        if init is not None and init.opcode == "tuple":
            start = _constant(instructions.get(_operand_names(init)[index]))
        return max(0, limit - (start or 0) + (direction == "LE"))
    return None


def stage_costs(text: str, stages: Iterable[str] = (), trip_counts: bool = True
                ) -> dict[str, Cost]:
    """Per-device cost of the program in `text` (`Compiled.as_text()`) per stage named in
    `stages` (`other` for the rest); `trip_counts=False` counts every loop body once, as XLA's
    own analysis does. The key `unknown_loops` holds `Cost(flops=count)` of loops counted once
    for want of a trip count."""
    computations, entry = parse_module(text)
    instructions = {i.name: i for body in computations.values() for i in body}
    types = {name: i.shape for name, i in instructions.items()}
    stages = tuple(stages)
    totals: dict[str, Cost] = {}
    unknown = 0

    def add(stage: str, cost: Cost) -> None:
        totals[stage] = totals.get(stage, Cost()) + cost

    def flops(ins: Instruction) -> float:
        kernel = ins.opcode == "custom-call" and SPLASH.match(ins.name)
        return _flops(ins, types, splash_share(ins, instructions) if kernel else 1.0)

    def inner_flops(name: str) -> float:
        return sum(flops(i) + sum(inner_flops(c) for k, c in CALLS.findall(i.attributes)
                                  if k == "calls")
                   for i in computations.get(name, []))

    def walk(name: str, scale: float, inherited: str) -> None:
        nonlocal unknown
        for ins in computations.get(name, []):
            stage = _stage(ins, stages, instructions) or inherited
            called = dict(CALLS.findall(ins.attributes))
            if ins.opcode == "fusion":
                body = computations.get(called.get("calls", ""), [])
                add(stage, Cost(inner_flops(called.get("calls", "")),
                                _fusion_bytes(ins, body, types)).times(scale))
            elif ins.opcode == "while":
                trip = trip_count(ins, called["condition"], computations, instructions)
                unknown += trip is None
                n = trip if trip is not None and trip_counts else 1
                walk(called["body"], scale * n, stage)
                walk(called["condition"], scale * (n + 1 if trip_counts else 1), stage)
            elif ins.opcode in ("call", "conditional", "async-start"):
                branches = BRANCHES.search(ins.attributes)
                names = ([b.strip().lstrip("%") for b in branches.group(1).split(",")]
                         if branches else [c for k, c in called.items() if k != "to_apply"])
                for callee in names:  # a conditional's branches all counted: an upper bound
                    walk(callee, scale, stage)
            else:
                add(stage, Cost(flops(ins), _bytes(ins, types)).times(scale))

    walk(entry, 1.0, "other")
    return {**totals, "unknown_loops": Cost(float(unknown))}


def total(costs: Mapping[str, Cost]) -> Cost:
    """All stages' cost together."""
    return sum((c for k, c in costs.items() if k != "unknown_loops"), Cost())
