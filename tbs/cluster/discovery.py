"""What a Ray cluster offers: its alive nodes, grouped so that identical machines are measured once.

Nodes are told apart by what changes a measurement: the CPU model and count, the GPUs (count and
Ray's ``accelerator_type:*`` resource), TPUs, custom resources and user labels. A small task pinned
to each node (hard node affinity) reads its CPU model and host name there; nothing is installed
at run time, so each node must already have tbs and its frameworks (docs/clusters.md says how).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tbs.errors import TbsError

INSTALL = "pip install 'tbs[ray]'"
_RAY_KEYS = ("node:", "memory", "object_store_memory", "CPU", "GPU", "TPU", "accelerator_type:")


def ray_module() -> Any:
    """Ray, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise TbsError(f"--cluster needs Ray, which is not installed: {INSTALL}") from None
    return ray


# How long joining a cluster may take before tbs gives up with one line (Ray's own client retries
# an address where nothing answers for about 14 minutes, printing its native log all the while).
CONNECT_TIMEOUT_S = 25.0
TCP_TIMEOUT_S = 5.0


def connect(address: str) -> Any:
    """Join the cluster at ``address`` ('auto', 'ray://host:port' or 'host:port'); one line when it cannot.

    An address where nothing listens is refused at once; anything else must answer as a Ray
    cluster within ``CONNECT_TIMEOUT_S``, tried first in a child process whose output (Ray's
    native log lines) is kept off the terminal.
    """
    ray = ray_module()
    if not address or not address.strip():
        raise TbsError("--cluster: give an address: auto for the current Ray cluster, or ray://HOST:PORT")
    if ray.is_initialized():
        return ray
    address = address.strip()
    endpoint = _endpoint(address)
    if endpoint is not None:
        _reachable(address, *endpoint)
    _probe(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise _unreachable(address, _first_line(str(exc)) or type(exc).__name__) from None
    return ray


def _unreachable(address: str, why: str) -> TbsError:
    return TbsError(f"--cluster {address}: cannot connect to a Ray cluster there ({why}); start one with "
                    f"'ray start --head' or check the address")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0][:200] if lines else ""


def _endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) of an explicit address; None for 'auto' (Ray finds it) or a form tbs does not parse."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _reachable(address: str, host: str, port: int) -> None:
    """Something must listen at host:port: a refused or silent address is one line at once, not minutes of retries."""
    import socket

    try:
        socket.create_connection((host, port), timeout=TCP_TIMEOUT_S).close()
    except OSError as exc:
        why = "nothing listens there" if isinstance(exc, ConnectionRefusedError) else (
            f"no answer within {TCP_TIMEOUT_S:g} s" if isinstance(exc, TimeoutError) else exc.strerror or str(exc))
        raise _unreachable(address, why) from None


def _probe(address: str) -> None:
    """Join and leave the cluster in a child process, bounded by CONNECT_TIMEOUT_S, its output captured."""
    import subprocess
    import sys

    code = ("import ray; ray.init(address=%r, include_dashboard=False, log_to_driver=False, logging_level='ERROR'); "
            "ray.shutdown()" % address)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=CONNECT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise _unreachable(address, f"it did not answer as a Ray cluster within {CONNECT_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "Error" in line and not line.startswith(" ")]
        raise _unreachable(address, _first_line(errors[-1] if errors else done.stderr) or f"exit {done.returncode}")


@dataclass
class NodeGroup:
    """Identical nodes: one of them measures for all."""

    name: str
    cpu_model: str
    cpus: int
    gpus: int
    accelerators: list[str]
    tpus: int
    resources: list[str]  # custom resources (a fake node's marker in tests, a pool name in real clusters)
    labels: dict[str, str]
    nodes: list[dict[str, str]] = field(default_factory=list)  # node_id, host

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cpu_model": self.cpu_model, "cpus": self.cpus, "gpus": self.gpus,
                "accelerators": self.accelerators, "tpus": self.tpus, "resources": self.resources,
                "labels": self.labels, "nodes": self.nodes}


def _probes(ray: Any, node_ids: list[str]) -> list[dict[str, str]]:
    """Each node's CPU model and host name, read on the node itself (all nodes at once)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def where() -> dict[str, str]:
        import socket

        from tbs.backends.host import cpu_model

        return {"cpu_model": cpu_model(), "host": socket.gethostname()}

    refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in node_ids]
    return ray.get(refs, timeout=120)


def _signature(node: dict[str, Any], probe: dict[str, str]) -> tuple:
    resources = node.get("Resources", {})
    accelerators = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
    custom = sorted(k for k in resources if not k.startswith(_RAY_KEYS))
    labels = {k: v for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")}
    return (probe["cpu_model"], int(resources.get("CPU", 0)), int(resources.get("GPU", 0)), tuple(accelerators),
            int(resources.get("TPU", 0)), tuple(custom), tuple(sorted(labels.items())))


def node_groups(ray: Any) -> list[NodeGroup]:
    """The cluster's alive nodes, grouped by what they offer; each group named after its first node."""
    groups: dict[tuple, NodeGroup] = {}
    alive = [n for n in ray.nodes() if n.get("Alive")]
    for node, probe in zip(alive, _probes(ray, [n["NodeID"] for n in alive])):
        key = _signature(node, probe)
        if key not in groups:
            cpu_model, cpus, gpus, accelerators, tpus, custom, labels = key
            name = dict(labels).get("tbs/group") or (custom[0] if custom else probe["host"])
            groups[key] = NodeGroup(name, cpu_model, cpus, gpus, list(accelerators), tpus, list(custom), dict(labels))
        groups[key].nodes.append({"node_id": node["NodeID"], "host": probe["host"]})
    names: dict[str, int] = {}
    for group in groups.values():  # two groups on hosts of one name get distinct names
        names[group.name] = names.get(group.name, 0) + 1
        if names[group.name] > 1:
            group.name = f"{group.name}-{names[group.name]}"
    return list(groups.values())


def describe(groups: list[NodeGroup]) -> str:
    """``tbs devices --cluster``: one paragraph per node group."""
    lines = []
    for g in groups:
        offers = [f"{g.cpus} CPUs ({g.cpu_model})"]
        if g.gpus:
            offers.append(f"{g.gpus} GPU{'s' if g.gpus > 1 else ''}" + (f" ({', '.join(g.accelerators)})" if g.accelerators else ""))
        if g.tpus:
            offers.append(f"{g.tpus} TPU chips")
        extra = f"; resources {', '.join(g.resources)}" if g.resources else ""
        lines.append(f"{g.name}: {len(g.nodes)} node{'s' if len(g.nodes) > 1 else ''}, {', '.join(offers)}{extra}")
        lines += [f"  {n['host']} ({n['node_id'][:12]})" for n in g.nodes]
    return "\n".join(lines) if lines else "the cluster has no alive node"
