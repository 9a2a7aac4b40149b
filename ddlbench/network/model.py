"""A network as dimensions and the alpha-beta cost of collectives on it (pure functions,
hand-checked in tests/test_network.py).

A network is a list of dimensions, innermost first: e.g. NVLink inside a node (8 devices), the
NICs to a leaf switch (16 nodes), the spine. Devices fill the innermost dimension first, so N
devices use n_1 = min(N, size_1) of dimension 1, n_2 = min(ceil(N / size_1), size_2) of
dimension 2, and so on. Each dimension has a latency alpha (s per message step) and a per-device
bandwidth into that dimension (bytes/s; beta = 1 / bandwidth).

Costs for a payload of B bytes over p ranks on one dimension (Thakur, Rabenseifner & Gropp 2005;
Patarasuk & Yuan 2009):
    ring all-reduce           2 (p-1) alpha + 2 (p-1)/p B beta
    tree all-reduce           2 ceil(log2 p) alpha + 2 B beta        (pipelined double binary tree)
    reduce-scatter/all-gather (p-1) alpha + (p-1)/p B beta           (B = the full buffer)
    broadcast                 ceil(log2 p) alpha + B beta            (pipelined tree)
    point-to-point            alpha + B beta
Across several dimensions:
    flat (ring or tree): the algorithm over all p = prod n_i ranks, at the slowest spanned
        dimension's bandwidth and highest latency (a `shared` dimension, one link per unit below
        shared by its devices, carries one ring flow per link: the whole link, not a share);
    hierarchical (multi-dimensional; 2D-torus / Themis / LIBRA style): reduce-scatter along
        dimension 1 on B, along dimension 2 on B / n_1, ..., then all-gather back, so dimension i
        carries 2 (n_i - 1)/n_i * B / (n_1 ... n_{i-1}) per device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

GB = 1e9
ALGORITHMS = ("ring", "tree", "hierarchical")
GLOO = "gloo"      # flat rings; reduce-scatter as an all-reduce of the whole input (backend_algorithm)


@dataclass(frozen=True)
class Dimension:
    name: str
    size: int                   # devices (dim 1) or units of the previous level per unit of this one
    bandwidth: float            # bytes/s per device into this dimension
    latency: float              # seconds per message step
    cost_per_GBps: float = 0.0  # cost units per GB/s of per-device bandwidth (allocation)
    # one link per unit of the dimension below, shared by the devices beneath it (`bench cluster`'s
    # node uplink): `bandwidth` is each device's share; one flow alone gets the whole link
    shared: bool = False
    # a shaped link's token bucket (`bench cluster`'s tbf): bytes a link idle long enough sends at
    # once; 0 for a real network (ddlbench/estimate/schedule.py prices it)
    burst_bytes: float = 0.0


@dataclass(frozen=True)
class Network:
    name: str
    dims: tuple[Dimension, ...]
    description: str = ""
    source: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def max_devices(self) -> int:
        return math.prod(d.size for d in self.dims)

    def with_bandwidths(self, bandwidths: list[float]) -> "Network":
        return Network(self.name, tuple(replace(d, bandwidth=b) for d, b in zip(self.dims, bandwidths)),
                       self.description, self.source, self.meta)


def load(name_or_path: str, conf_dir: Path | None = None) -> Network:
    """conf/network/<name>.yaml (or a path to such a file)."""
    import yaml

    from ddlbench.errors import ConfigError
    conf = conf_dir or Path(__file__).resolve().parents[2] / "conf" / "network"
    path = Path(name_or_path)
    named = not path.suffix and "/" not in name_or_path
    if named:
        path = conf / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in conf.glob("*.yaml")))
        if named:
            raise ConfigError(f"unknown network '{name_or_path}' (known: {known})")
        raise ConfigError(f"network={name_or_path}: no such network file (a path to a .yaml file like "
                          f"conf/network/*.yaml, or one of: {known})")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"network={name_or_path}: not a network description ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"network={name_or_path}: not a network description (expected a YAML mapping with "
                          "name and dimensions)")
    return from_dict(doc, path)


def for_world_sizes(name_or_path: str, sizes: list[int]) -> "Network":
    """The network, ConfigError where a world size exceeds it."""
    from ddlbench.errors import ConfigError
    net = load(name_or_path)
    too_big = [n for n in sizes if n > net.max_devices]
    if too_big:
        raise ConfigError(f"world sizes {too_big} exceed network {net.name} ({net.max_devices:,} devices)")
    return net


def recorded_network(rec: dict) -> "Network | None":
    """The network a run recorded in result.json (env.network: inside `bench cluster`, its link
    rates; ddlbench.machine.envinfo.network_ran_on), or None."""
    described = (rec.get("env") or {}).get("network") or {}
    if not described.get("description"):
        return None
    return from_dict(described["description"], described.get("source", "<result.json>"))


def from_dict(raw: dict, path: Path | str = "<inline>") -> Network:
    """A network from its description (the yaml's content; result.json's env.network)."""
    from ddlbench.errors import ConfigError
    path = Path(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("dimensions"), list) or not raw["dimensions"]:
        raise ConfigError(f"network {path}: needs a non-empty list `dimensions` (name, size, bandwidth_GBps, latency_us)")
    dims = []
    for i, d in enumerate(raw["dimensions"]):
        if not isinstance(d, dict) or not all(k in d for k in ("name", "size", "bandwidth_GBps", "latency_us")):
            raise ConfigError(f"network {path}: dimension {i + 1} needs name, size, bandwidth_GBps, latency_us")
        where = f"network {path}: dimension {d['name']!r}"
        dims.append(Dimension(str(d["name"]), _count(d["size"], f"{where} size"),
                              _real(d["bandwidth_GBps"], f"{where} bandwidth_GBps", positive=True) * GB,
                              _real(d["latency_us"], f"{where} latency_us") * 1e-6,
                              _real(d.get("cost_per_GBps", 0.0), f"{where} cost_per_GBps"),
                              bool(d.get("shared", False)),
                              _real(d.get("burst_bytes", 0.0), f"{where} burst_bytes")))
    dims = tuple(dims)
    return Network(str(raw.get("name", path.stem)), dims, str(raw.get("description", "")), str(path),
                   {k: v for k, v in raw.items() if k not in ("name", "dimensions", "description")})


def _real(value, what: str, positive: bool = False) -> float:
    """A finite number >= 0 (> 0 where `positive`), or ConfigError naming the field and the range."""
    from ddlbench.errors import ConfigError
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(value, bool) or not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise ConfigError(f"{what} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return x


def _count(value, what: str) -> int:
    """A whole number >= 1 (2.5, .inf, nan, '8x' are refused, not rounded)."""
    from ddlbench.errors import ConfigError
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if not ok or value < 1:
        raise ConfigError(f"{what} must be a whole number >= 1, got {value!r}")
    return int(value)


def layout(network: Network, devices: int) -> list[int]:
    """Devices used per dimension when `devices` fill the network innermost-first."""
    if devices < 1:
        raise ValueError("devices must be >= 1")
    if devices > network.max_devices:
        raise ValueError(f"{devices} devices exceed network {network.name} ({network.max_devices})")
    out, left = [], devices
    for d in network.dims:
        n = min(left, d.size)
        out.append(n)
        left = math.ceil(left / n)
    return out


def _log2(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def ring_allreduce(b: float, p: int, alpha: float, bw: float) -> float:
    return 0.0 if p <= 1 else 2 * (p - 1) * alpha + 2 * (p - 1) / p * b / bw


def tree_allreduce(b: float, p: int, alpha: float, bw: float) -> float:
    return 0.0 if p <= 1 else 2 * _log2(p) * alpha + 2 * b / bw


def ring_gather(b: float, p: int, alpha: float, bw: float) -> float:
    """Reduce-scatter or all-gather of a full buffer of b bytes."""
    return 0.0 if p <= 1 else (p - 1) * alpha + (p - 1) / p * b / bw


def broadcast(b: float, p: int, alpha: float, bw: float) -> float:
    return 0.0 if p <= 1 else _log2(p) * alpha + b / bw


def p2p(b: float, alpha: float, bw: float) -> float:
    return alpha + b / bw


def hierarchical(kind: str, b: float, spans: list[tuple[int, Dimension]], gloo: bool = False) -> float:
    """Multi-dimensional algorithm: dimension by dimension, the payload shrinking by each
    dimension's size on the way (all-reduce = reduce-scatter down + all-gather up). gloo: built
    from gloo's collectives (commbench's all_reduce_hier): a reduce-scatter that is an all-reduce
    of the whole input and an all-gather on each dimension but the outermost, which all-reduces
    what is left. A `shared` dimension is reached through a switch: its traffic also crosses the
    device's links of the dimensions inside it, at the slowest of them."""
    t, size, path = 0.0, float(b), []
    for i, (n, d) in enumerate(spans):
        path.append(d.bandwidth)
        if d.shared:     # behind a switch: this dimension's traffic also crosses the device's inner links
            d = replace(d, bandwidth=min(path))
        if kind == "all_reduce" and gloo:
            t += ring_allreduce(size, n, d.latency, d.bandwidth) + (
                ring_gather(size, n, d.latency, d.bandwidth) if i < len(spans) - 1 else 0.0)
        elif kind == "all_reduce":
            t += 2 * ring_gather(size, n, d.latency, d.bandwidth)
        elif kind in ("all_gather", "reduce_scatter", "reduce"):
            t += ring_gather(size, n, d.latency, d.bandwidth)
        elif kind == "broadcast":
            t += broadcast(b, n, d.latency, d.bandwidth)
        size /= max(n, 1)
    return t


def ring_bandwidth(spans: list[tuple[int, Dimension]]) -> float:
    """The bandwidth a flat ring (ranks in block order) runs at: the slowest spanned dimension's,
    where a shared dimension's link carries one flow of the ring per unit below it, so that flow
    has the whole link: its per-device share x the devices beneath."""
    inner, bws = 1, []
    for n, d in spans:
        if n > 1:
            bws.append(d.bandwidth * (inner if d.shared else 1))
        inner *= n
    return min(bws)


def flat(kind: str, algorithm: str, b: float, spans: list[tuple[int, Dimension]]) -> float:
    p = math.prod(n for n, _ in spans)
    active = [d for n, d in spans if n > 1]
    if p <= 1 or not active:
        return 0.0
    alpha, bw = max(d.latency for d in active), ring_bandwidth(spans)
    if algorithm == GLOO and kind == "reduce_scatter":
        return ring_allreduce(b, p, alpha, bw)
    if kind == "all_reduce":
        return (tree_allreduce if algorithm == "tree" else ring_allreduce)(b, p, alpha, bw)
    if kind in ("all_gather", "reduce_scatter", "reduce"):
        return ring_gather(b, p, alpha, bw)
    if kind == "broadcast":
        return broadcast(b, p, alpha, bw)
    raise ValueError(f"no flat model for {kind}")


def all_to_all(b: float, spans: list[tuple[int, Dimension]]) -> float:
    """All-to-all of b bytes per rank (each rank sends b/p to every rank, itself included): p - 1
    pairwise exchanges (latency each); the bytes whose destination lies outside a rank's group
    below dimension i cross dimension i's links, b (p - c) / p with c the ranks below it, all
    dimensions' links at once: the slowest of them bounds the time (NCCL's and gloo's pairwise
    all_to_all_single; a hierarchical all-to-all is not modelled)."""
    p, below, crossing = math.prod(n for n, _ in spans), 1, []
    for n, _ in spans:
        crossing.append(b * (p - below) / p if n > 1 else 0.0)
        below *= n
    return exchange_time(crossing, spans)


def exchange_time(crossing: list[float], spans: list[tuple[int, Dimension]]) -> float:
    """A pairwise exchange among the ranks `spans` describes, `crossing[i]` bytes per rank leaving its group
    below dimension i over that dimension's links: p - 1 latencies (the largest dimension's) and the slowest
    dimension's bytes at its rate, all dimensions at once (all_to_all; expert dispatch, estimate/dispatch.py)."""
    p = math.prod(n for n, _ in spans)
    if p <= 1:
        return 0.0
    alpha = max(d.latency for n, d in spans if n > 1)
    return (p - 1) * alpha + max(c / d.bandwidth for c, (_, d) in zip(crossing, spans))


def backend_algorithm(backend: str | None) -> str:
    """The algorithm a backend's collectives run, for pricing its runs: gloo's ('gloo') are flat
    rings over every rank of the group, blind to nodes (4 ranks on 2 nodes: one ring that crosses
    the link with 2 (p-1)/p of the buffer, not a reduce-scatter inside the node first), and its
    reduce-scatter is an all-reduce of the whole input (ProcessGroupGloo; measured on its sockets,
    ddlbench.metrics.comm's wire factors); NCCL chooses ring, tree or a hierarchy per size and
    topology: the fastest ('best')."""
    return GLOO if backend == "gloo" else "best"


def _segment(fit: dict, message_bytes: float | None, ranks: int) -> dict:
    """The part of a per-kind fit that prices a message: the segment (ddlbench.network.fit) its
    size falls in, sizes compared per ring step (a message of b bytes over p ranks moves b / p a
    step, as b x world_size / p does in the fit's runs); the whole fit without a size."""
    segments = fit.get("segments")
    if not segments or message_bytes is None:
        return fit
    at = message_bytes * int(fit.get("world_size") or ranks) / max(ranks, 1)
    return next((s for s in segments if s.get("up_to_bytes") is None or at <= s["up_to_bytes"]), segments[-1])


def kind_spans(network: Network, kind: str, spans: list[tuple[int, Dimension]],
               message_bytes: float | None = None) -> list[tuple[int, Dimension]]:
    """`spans` with each dimension that a per-kind fit priced (the network's `kinds`:
    {kind: {dimension: {bandwidth_GBps, latency_us[, world_size, segments, by_world]}}}, written by
    bench commbench) at that kind's fitted bandwidth and latency for a message of `message_bytes`
    (from the fit measured at the collective's number of ranks where `by_world` has one); the
    others as described."""
    fitted = (network.meta.get("kinds") or {}).get(kind) or {}
    ranks = math.prod(n for n, _ in spans)
    out = []
    for n, d in spans:
        if d.name in fitted:
            at_world = fitted[d.name].get("by_world") or {}     # a fit measured at this many ranks
            f = _segment(at_world.get(ranks) or at_world.get(str(ranks)) or fitted[d.name], message_bytes, ranks)
            d = replace(d, bandwidth=float(f["bandwidth_GBps"]) * GB, latency=float(f["latency_us"]) * 1e-6)
        out.append((n, d))
    return out


def collective_time(kind: str, b: float, spans: list[tuple[int, Dimension]], algorithm: str = "best") -> tuple[float, str]:
    """(seconds, algorithm used) for one collective of `kind` over the ranks `spans` describes:
    [(ranks along dimension i, dimension i)]. 'best' = the fastest of ring, tree, hierarchical."""
    if kind in ("send", "recv"):
        crossing = [d for n, d in spans if n > 1] or [spans[0][1]]
        d = crossing[-1]                        # the outermost dimension the pipeline crosses
        return (p2p(b, d.latency, d.bandwidth) if kind == "send" else 0.0), "p2p"
    if kind == "all_to_all":
        return all_to_all(b, spans), "pairwise"
    if kind not in ("all_reduce", "all_gather", "reduce_scatter", "reduce", "broadcast"):
        return 0.0, "none"
    if algorithm == GLOO:
        return flat(kind, GLOO, b, spans), GLOO
    options = {}
    for alg in (ALGORITHMS if algorithm == "best" else (algorithm,)):
        if alg == "hierarchical":
            options[alg] = hierarchical(kind, b, spans)
        elif alg == "tree" and kind != "all_reduce":
            options["ring"] = flat(kind, "ring", b, spans)   # trees only modelled for all-reduce
        else:
            options[alg] = flat(kind, alg, b, spans)
    if not options:
        raise ValueError(f"algorithm {algorithm} has no model for {kind}")
    alg = min(options, key=options.get)
    return options[alg], alg
