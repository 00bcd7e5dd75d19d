"""Device mesh ("data", "fsdp", "tp"), logical-axis sharding rules, model placement, the
project's single `jax.distributed.initialize` call, and the accelerators a memory plan is
checked against (their memory, bandwidth and FLOP/s).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "tp")

# Logical axis -> mesh axis (or tuple of mesh axes, or None = replicated).
# train: FSDP shards the embed dimension of every weight (gathered per layer by XLA), tensor
#   parallelism shards heads, MLP and vocab; the batch is split over data and fsdp together.
# sample: weights are replicated over data/fsdp (decode is latency bound: no per-step gather),
#   tp still splits heads/MLP/vocab; every non-tp device decodes its own slice of the batch.
_TRAIN_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "seq": None,
    "vocab": "tp",
    "embed": "fsdp",
    "q_heads": "tp",
    "kv_heads": "tp",
    "head_dim": None,
    "mlp": "tp",
    "norm": None,
    "layers": None,
    "cache_seq": None,
}
RULES: dict[str, dict[str, str | tuple[str, ...] | None]] = {
    "train": _TRAIN_RULES,
    "sample": {**_TRAIN_RULES, "embed": None},  # the one difference: no FSDP
}


# Activations (both rule sets): rows over data x fsdp, vocabulary-sized logits over tp; other
# dims follow the weights through XLA's sharding propagation.
ACTIVATION_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "seq": None,
    "act_embed": None,
    "act_vocab": "tp",
}


def constrain(x: jax.Array, logical_axes) -> jax.Array:
    """Sharding constraint for an activation under the current `jax.set_mesh` (no-op without
    one). Keeps e.g. logits [B, T, V] split over the batch instead of replicated."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(AXES) <= set(mesh.axis_names):
        return x
    spec = logical_to_spec(logical_axes, mesh, ACTIVATION_RULES, x.shape)
    return jax.lax.with_sharding_constraint(x, spec)


def make_mesh(shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh with axes ("data", "fsdp", "tp"); missing axes have size 1, one size may be -1.

    shape: e.g. {"fsdp": 4, "tp": 2} or an ml_collections ConfigDict with those keys.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = dict(shape)
    unknown = sorted(set(shape) - set(AXES))
    if unknown:
        raise ValueError(f"mesh shape: unknown axes {unknown}; allowed axes are {list(AXES)}")
    sizes = [int(shape.get(a, 1)) for a in AXES]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh shape {shape}: sizes must be positive, with at most one -1")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if len(devices) % known:
            raise ValueError(f"mesh shape {shape}: {len(devices)} devices not divisible by {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"mesh shape {shape} needs {math.prod(sizes)} devices but {len(devices)} are given"
        )
    return jax.make_mesh(sizes, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def _rules(rules) -> Mapping[str, str | tuple[str, ...] | None]:
    if isinstance(rules, str):
        if rules not in RULES:
            raise ValueError(f"rules={rules!r}: allowed names are {sorted(RULES)}")
        return RULES[rules]
    return rules


def logical_to_spec(logical_axes, mesh: Mesh, rules, shape=None) -> PartitionSpec:
    """PartitionSpec for an array whose dimensions have the given logical names.

    A mesh axis is used at most once per array (first dimension wins). When `shape` is given, a
    dimension not divisible by its mesh axes' size stays replicated instead of failing.
    """
    rules = _rules(rules)
    used: set[str] = set()
    spec = []
    for dim, name in enumerate(logical_axes):
        if name is not None and name not in rules:
            raise KeyError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used and mesh.shape.get(a, 1) > 1)
        size = math.prod(mesh.shape[a] for a in axes)
        if shape is not None and shape[dim] % size:
            axes = ()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def logical_to_sharding(logical_axes, mesh: Mesh, rules, shape=None) -> NamedSharding:
    """NamedSharding for an array with the given logical axis names (see `logical_to_spec`)."""
    return NamedSharding(mesh, logical_to_spec(logical_axes, mesh, rules, shape))


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def model_shardings(abstract_model_state, mesh: Mesh, rules):
    """NamedShardings for an nnx state (abstract or concrete), from each Variable's
    `logical_axes` metadata; Variables without it are replicated. Same tree structure."""

    def one(var):
        axes = var.get_metadata().get("logical_axes")
        shape = np.shape(var.get_value())
        if axes is None:
            return var.replace(NamedSharding(mesh, PartitionSpec()))
        if len(axes) != len(shape):
            raise ValueError(f"logical axes {axes} do not match a parameter of shape {shape}")
        return var.replace(logical_to_sharding(axes, mesh, rules, shape))

    return jax.tree.map(one, abstract_model_state, is_leaf=_is_var)


def shard_model(model: nnx.Module, mesh: Mesh, rules) -> nnx.Module:
    """Moves an nnx model's state onto `mesh` according to its logical axes (in place)."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, model_shardings(state, mesh, rules)))
    return model


def init_sharded(make_model: Callable[[], nnx.Module], mesh: Mesh, rules) -> nnx.Module:
    """Builds `make_model()` with every parameter created directly on its shards.

    eval_shape gives the shapes, `model_shardings` the placements, and one jitted init with
    those out_shardings materialises the state: no device ever holds the whole model.
    """
    abstract = nnx.eval_shape(make_model)
    graphdef, abstract_state = nnx.split(abstract)
    shardings = model_shardings(abstract_state, mesh, rules)
    state = jax.jit(lambda: nnx.state(make_model()), out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def abstract_sharded_state(make_model: Callable[[], nnx.Module], mesh: Mesh, rules):
    """(graphdef, state of ShapeDtypeStructs carrying their shardings); allocates nothing.

    Feed the state to `jax.jit(...).lower` to plan memory for real model sizes.
    """
    graphdef, state = nnx.split(nnx.eval_shape(make_model))
    shardings = model_shardings(state, mesh, rules)
    state = jax.tree.map(
        lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s), state, shardings
    )
    return graphdef, state


def memory_per_device(lowered) -> dict[str, int]:
    """Compiles a `jax.jit(...).lower(...)` result; its XLA memory analysis in bytes per device,
    and the cost analysis's FLOPs and bytes accessed per device (0 where XLA gives none).

    peak = arguments + outputs - aliased (donated) + temporaries.
    """
    compiled = lowered.compile()
    stats = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    out = {
        "arguments": int(stats.argument_size_in_bytes),
        "outputs": int(stats.output_size_in_bytes),
        "aliased": int(stats.alias_size_in_bytes),
        "temporaries": int(stats.temp_size_in_bytes),
    }
    out["peak"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
    out["flops"] = int(cost.get("flops", 0))
    out["bytes_accessed"] = int(cost.get("bytes accessed", 0))
    return out


def device_memory_stats() -> list[dict]:
    """`memory_stats()` of each device this process drives; [] where the backend keeps none
    (CPU)."""
    out = []
    for dev in jax.local_devices():
        stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
        if stats:
            out.append(stats)
    return out


def peak_bytes_in_use() -> int | None:
    """The largest high-water mark of allocated bytes over this process's devices (since the
    process started), or None where the backend keeps no memory statistics (CPU)."""
    peaks = [s["peak_bytes_in_use"] for s in device_memory_stats() if "peak_bytes_in_use" in s]
    return max(peaks) if peaks else None


def device_bytes_limit() -> int | None:
    """The smallest number of bytes a device of this process may allocate (`bytes_limit`:
    on GPU the memory times XLA_PYTHON_CLIENT_MEM_FRACTION), or None where unknown (CPU)."""
    limits = [s["bytes_limit"] for s in device_memory_stats() if s.get("bytes_limit")]
    return min(limits) if limits else None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an integer") from None


def _cluster_detected() -> bool:
    # Environments where jax.distributed.initialize() can discover its peers by itself.
    slurm = (_env_int("SLURM_NTASKS") or 1) > 1 and "SLURM_JOB_ID" in os.environ
    tpu_pod = len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1
    return slurm or tpu_pod


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
) -> bool:
    """Joins a multi-process JAX job; returns True when running with more than one process.

    Arguments fall back to JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID, then
    to JAX's own cluster auto-detection (SLURM, TPU pods). A single process is a no-op, and a
    second call after a successful first one returns without re-initialising.
    """
    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    num_processes = num_processes if num_processes is not None else _env_int("JAX_NUM_PROCESSES")
    process_id = process_id if process_id is not None else _env_int("JAX_PROCESS_ID")
    if num_processes == 1:
        return False
    if coordinator_address is None and num_processes is None:
        if not _cluster_detected():
            return False
        jax.distributed.initialize(local_device_ids=local_device_ids)
        return jax.process_count() > 1
    missing = [
        name
        for name, v in [
            ("coordinator_address / JAX_COORDINATOR_ADDRESS", coordinator_address),
            ("num_processes / JAX_NUM_PROCESSES", num_processes),
            ("process_id / JAX_PROCESS_ID", process_id),
        ]
        if v is None
    ]
    if missing:
        raise ValueError(f"initialize_distributed: missing {missing} for a multi-process job")
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
    )
    return jax.process_count() > 1


CACHE_ENV = "MAPFJAX_COMPILATION_CACHE"


def enable_compilation_cache(path: str | os.PathLike | None = None) -> str | None:
    """Turns on JAX's persistent compilation cache, so a rerun, a resumed run or the next run
    of a sweep loads its compiled programs instead of compiling them again (on 2 CPU cores a
    tiny loop's compiles are over half its time). Where: `path`, else $MAPFJAX_COMPILATION_CACHE,
    else $JAX_COMPILATION_CACHE_DIR, else ~/.cache/mapfjax/jax; "off" (or an empty value)
    leaves JAX untouched. Every program is cached, however short its compile. Returns the
    directory, or None when disabled. Call before the first compile (the launch scripts do)."""
    chosen = path if path is not None else os.environ.get(CACHE_ENV)
    if chosen is None:
        chosen = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(
            os.path.expanduser("~"), ".cache", "mapfjax", "jax"
        )
    chosen = str(chosen)
    if chosen.strip().lower() in ("", "off", "0", "none"):
        return None
    jax.config.update("jax_compilation_cache_dir", chosen)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return chosen


def mesh_from_spec(spec: str) -> Mesh:
    """A mesh from a compact spec such as "fsdp4-tp2" or "data2-fsdp4" (axis name + size)."""
    shape = {}
    for part in spec.split("-"):
        m = re.fullmatch(r"([a-z]+)(\d+)", part)
        if m is None or m[1] not in AXES:
            raise ValueError(
                f"mesh spec {spec!r}: part {part!r}; allowed: <axis><size> with axis "
                f"in {AXES}, joined by '-' (e.g. fsdp4-tp2)"
            )
        shape[m[1]] = int(m[2])
    return make_mesh(shape)


def describe_memory(mem: Mapping[str, int], caps_gb: Sequence[int] = (16, 80)) -> str:
    """One line for `memory_per_device` output: GiB per device and which device sizes fit. A
    "growth" entry (bytes alive beside the program, e.g. `sampler.growth_bytes`) is added to
    the peak and named."""
    gib = {k: v / 2**30 for k, v in mem.items() if k not in ("flops", "bytes_accessed")}
    peak = mem["peak"] + mem.get("growth", 0)
    fits = [f"{cap} GB" for cap in caps_gb if peak <= cap * 2**30]
    grow = f", cache growth {gib['growth']:.2f}" if "growth" in mem else ""
    return (
        f"peak {peak / 2**30:7.2f} (args {gib['arguments']:.2f}, out {gib['outputs']:.2f}, "
        f"aliased {gib['aliased']:.2f}, temp {gib['temporaries']:.2f}{grow})  "
        f"fits: {', '.join(fits) or '-'}"
    )


# ------------------------------------------------------------------------ accelerators


@dataclasses.dataclass(frozen=True)
class DeviceKind:
    """One accelerator: `match`, a lower-case substring of jax's `device_kind` (the first
    match in DEVICE_KINDS wins); its memory per device in bytes; the share of it a program may
    use (`usable`: on GPU the XLA_PYTHON_CLIENT_MEM_FRACTION the recipes set, 0.95, where
    JAX's default is 0.75; on TPU what the runtime leaves); peak HBM bandwidth (bytes/s) and
    dense bf16 FLOP/s from the vendors' datasheets."""

    match: str
    name: str
    memory: int
    usable: float
    bandwidth: float
    flops: float

    @property
    def usable_bytes(self) -> int:
        return int(self.memory * self.usable)

    def describe(self) -> str:
        return (
            f"{self.name}: {self.bandwidth / 1e12:.3g} TB/s, {self.flops / 1e12:.0f} TFLOP/s "
            f"bf16 dense"
        )


MIB, GIB = 2**20, 2**30
DEVICE_KINDS = (
    DeviceKind("h200", "NVIDIA H200 SXM", 143_771 * MIB, 0.95, 4.8e12, 989e12),
    DeviceKind("h100 pcie", "NVIDIA H100 PCIe", 81_559 * MIB, 0.95, 2.0e12, 756e12),
    DeviceKind("h100", "NVIDIA H100 SXM", 81_559 * MIB, 0.95, 3.35e12, 989e12),
    DeviceKind("a100-sxm4-80gb", "NVIDIA A100 80GB SXM", 81_920 * MIB, 0.95, 2.039e12, 312e12),
    DeviceKind("a100", "NVIDIA A100 40GB", 40_960 * MIB, 0.95, 1.555e12, 312e12),
    DeviceKind("tpu v6 lite", "TPU v6e", 32 * GIB, 0.96, 1.64e12, 918e12),
    DeviceKind("tpu v5 lite", "TPU v5e", 16 * GIB, 0.96, 0.819e12, 197e12),
    DeviceKind("tpu v5", "TPU v5p", 95 * GIB, 0.96, 2.765e12, 459e12),
    DeviceKind("tpu v4", "TPU v4", 32 * GIB, 0.96, 1.2e12, 275e12),
)

# Machines one launches on: (device kind's `match`, number of jax devices). A TPU slice's
# name counts TensorCores; jax sees one device per chip (v5p-8 and v4-8: 4 chips).
TARGETS = {
    "h100x8": ("h100", 8),
    "h200x8": ("h200", 8),
    "h100x1": ("h100", 1),
    "h200x1": ("h200", 1),
    "v5p-8": ("tpu v5", 4),
    "v4-8": ("tpu v4", 4),
}


def device_kind(kind: str) -> DeviceKind | None:
    """The DEVICE_KINDS entry of a jax `device_kind` string (or a `match`), None if unknown."""
    low = kind.lower()
    return next((d for d in DEVICE_KINDS if d.match in low), None)


def target(name: str) -> tuple[DeviceKind, int]:
    """(device kind, device count) of a TARGETS name; ValueError naming the known ones."""
    if name not in TARGETS:
        raise ValueError(f"target {name!r}; allowed: {', '.join(TARGETS)}")
    match, count = TARGETS[name]
    return device_kind(match), count
