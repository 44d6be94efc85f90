"""The driver: one profiling task per node group, every cell written into one profile as it arrives.

Each group's task is pinned to one of its nodes (hard node affinity). Devices are named
``group/device`` (as merged profiles name them). A task whose node dies is tried again on
another node of its group with the cells already received skipped; a group with no node left
is recorded with the reason, and the profile says it is incomplete.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tbs.cluster.discovery import NodeGroup, connect, node_groups
from tbs.cluster.node import profile_here
from tbs.profiles.profile import load_profile
from tbs.profiles.store import ProfileStore, finalize
from tbs.schema import CellKey, Metadata, ProfileStatus

if TYPE_CHECKING:
    from tbs.run import RunOptions

PER_GROUP = ("calibration", "capacity", "harness_overhead", "in_context")


def _label(group: str, device: str) -> str:
    return f"{group}/{device}"


class Collector:
    """Writes what the groups send into the driver's store, devices relabelled by group; shows their progress."""

    def __init__(self, store: ProfileStore, progress: Any = None) -> None:
        self.store, self.progress = store, progress
        self.received: dict[str, list[tuple]] = {}  # group -> cell keys as the node names them
        self.left: dict[str, float] = {}  # group -> its own ETA (seconds)

    def progressed(self, group: str, label: str, remaining_seconds: float | None) -> None:
        """One line for the cluster: the group that spoke, what it does, and the slowest group's ETA."""
        if self.progress is None:
            return
        if remaining_seconds is None:
            self.progress.describe(f"{group}: {label}")
            return
        self.left[group] = float(remaining_seconds)
        self.progress.advance(f"{group}: {label}", max(self.left.values()))

    def cell(self, group: str, key: tuple, row: dict[str, Any], samples: list[dict], analysis: list[dict],
             ops: list[dict] = ()) -> None:
        local = CellKey(*key)
        self.received.setdefault(group, []).append(tuple(local))
        label = _label(group, local.device)
        self.store.add_cell(local._replace(device=label), dict(row, device=label, host=group),
                            [dict(s, device=label) for s in samples], [dict(a, device=label) for a in analysis],
                            [dict(o, device=label) for o in ops])

    def metadata(self, group: str, node_metadata: dict[str, Any]) -> None:
        """A node's metadata merged into the cluster profile's: its devices, fits and environment named by group."""
        m, meta = self.store.metadata, Metadata.from_dict(node_metadata)
        for key in ("model", "inputs", "input_source", "seed", "mode", "batch_sizes", "layers", "graph",
                    "training", "timing", "xla", "backend", "tbs_profile_version", "tbs_version", "kernel_rules"):
            if key in node_metadata and not m.get(key):
                m[key] = node_metadata[key]
        devices = [d for d in m.get("devices", []) if not str(d.get("name", "")).startswith(f"{group}/")]
        m["devices"] = devices + [dict(d, name=_label(group, d["name"]), host=group) for d in meta.devices]
        for key in PER_GROUP:
            for name, value in getattr(meta, key).items():
                m.setdefault(key, {})[_label(group, name.split("@")[0]) + name[len(name.split("@")[0]):]] = value
        for pair, fit in meta.transfers.items():  # copies between the devices of one node
            src, _, dst = pair.partition("->")
            m.setdefault("transfers", {})[f"{_label(group, src)}->{_label(group, dst)}"] = fit
        envs = [e for e in m.get("environments", []) if e.get("group") != group]
        m["environments"] = envs + [{"group": group, **{k: meta.recorded(k) for k in ("host", "versions",
                                                                                              "settings", "node_id")}}]
        self.store.update_metadata()

    def drain(self, queue: Any) -> None:
        while not queue.empty():
            message = queue.get_nowait()
            kind, group = message[0], message[1]
            if kind == "cell":
                self.cell(group, *message[2:])
            elif kind == "metadata":
                self.metadata(group, message[2])
            elif kind == "progress":
                self.progressed(group, *message[2:])


def travelling_files(options: RunOptions) -> dict[str, bytes]:
    """The --input file and --custom-objects files, as bytes by path: no node shares the driver's disk."""
    paths = ([options.input] if options.input is not None else []) + list(options.custom_objects or [])
    return {str(p): Path(p).read_bytes() for p in paths}


def _open(store: ProfileStore, groups: list[NodeGroup], resume: bool, progress: Any) -> Collector:
    """A new cluster profile, or an unfinished one reopened: its cells are what each group need not measure."""
    collector = Collector(store, progress)
    if resume and store.existing_status() in (ProfileStatus.RUNNING, ProfileStatus.INTERRUPTED):
        store.resume({})
        for key, _ in store.resumed_rows:
            group, _, device = key.device.partition("/")
            collector.received.setdefault(group, []).append(tuple(key._replace(device=device)))
        store.update_metadata(cluster={g.name: g.as_dict() for g in groups})
    else:
        store.create({"status": ProfileStatus.RUNNING.value, "cluster": {g.name: g.as_dict() for g in groups},
                      "devices": []})
    return collector


class _Tasks:
    """The groups' profiling tasks: which node each runs on, the nodes left to retry on, and the failures."""

    def __init__(self, ray: Any, groups: list[NodeGroup], collector: Collector, options: RunOptions,
                 note: Callable[[str], None]) -> None:
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray, self.collector, self.options, self.note = ray, collector, options, note
        self._affinity = NodeAffinitySchedulingStrategy
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})  # dies only with the driver
        model = Path(options.model)
        self._model_ref, self._suffix = ray.put(model.read_bytes()), model.suffix
        self._files_ref = ray.put(travelling_files(options))
        self._remote = ray.remote(num_cpus=1, max_retries=0)(profile_here)
        self.left: dict[str, list[dict[str, str]]] = {g.name: list(g.nodes) for g in groups}
        self.used: dict[str, dict[str, str]] = {}  # group -> the node its (last) task ran on
        self.failures: dict[str, str] = {}
        self.running: dict[Any, NodeGroup] = {}

    def launch(self, group: NodeGroup) -> None:
        """The group's task on its next node, skipping the cells already received from it."""
        node = self.left[group.name].pop(0)
        self.used[group.name] = node
        self.note(f"tbs: profiling on {group.name} ({node['host']})")
        strategy = self._affinity(node["node_id"], soft=False)
        ref = self._remote.options(scheduling_strategy=strategy).remote(
            self._model_ref, self._suffix, self.options, self.queue, group.name,
            self.collector.received.get(group.name, []), self._files_ref)
        self.running[ref] = group

    def wait_all(self) -> None:
        """Drain cells while the tasks run; a task that fails is launched again on a twin node, or recorded."""
        while self.running:
            ready, _ = self.ray.wait(list(self.running), timeout=0.5)
            self.collector.drain(self.queue)
            for ref in ready:
                group = self.running.pop(ref)
                try:
                    self.ray.get(ref)
                except Exception as exc:  # the node died, or the profile failed there: retry on a twin
                    self._failed(group, str(exc).strip().splitlines()[0][:300] if str(exc).strip()
                                 else type(exc).__name__)
            time.sleep(0.05)

    def _failed(self, group: NodeGroup, reason: str) -> None:
        store = self.collector.store
        store.metadata.setdefault("retries", []).append(
            {"group": group.name, "reason": reason, "cells_kept": len(self.collector.received.get(group.name, []))})
        store.update_metadata()
        if self.left[group.name]:
            self.note(f"tbs: {group.name} failed ({reason}); trying another of its nodes")
            self.launch(group)
        else:
            self.failures[group.name] = reason

    def cancel(self) -> None:
        """Ctrl-C: cancel the tasks; every cell received stays."""
        for ref in self.running:
            self.ray.cancel(ref, force=True)
        self.failures["(all)"] = "interrupted (Ctrl-C)"


def profile_cluster(address: str, options: RunOptions, progress: Any = None) -> Any:
    """Profile ``options.model`` (a file) on every node group of the cluster at ``address``, into
    ``options.out``; returns the merged Profile. Each node gets the same checked options."""
    out = Path(options.out)
    ray = connect(address)
    groups = [g for g in node_groups(ray) if g.cpus > 0]
    note: Callable[[str], None] = progress.note if progress is not None else (lambda _: None)
    store = ProfileStore(out)
    store.lock()
    try:
        collector = _open(store, groups, options.resume, progress)
        tasks = _Tasks(ray, groups, collector, options, note)
        note("tbs: measuring on " + "; ".join(f"{g.name} ({len(g.nodes)} node{'s' if len(g.nodes) > 1 else ''})"
                                               for g in groups))
        if progress is not None:
            progress.start(0.0)
        for group in groups:
            tasks.launch(group)
        try:
            tasks.wait_all()
        except KeyboardInterrupt:
            tasks.cancel()
        collector.drain(tasks.queue)
        if progress is not None:
            progress.finish()
        store.update_metadata(devices_missing={g: f"node group failed: {r}" for g, r in tasks.failures.items()})
        if len(groups) > 1 and not tasks.failures and "cluster_links" not in store.metadata:
            note("tbs: timing copies between the node groups")
            _add_links(ray, [replace(g, nodes=[tasks.used[g.name]]) for g in groups], store)
        if tasks.failures:  # what was received stays; --resume measures the rest
            store.finish(ProfileStatus.INTERRUPTED)
            return load_profile(out)
        return finalize(store)
    finally:
        store.unlock()


def _add_links(ray: Any, groups: list[NodeGroup], store: ProfileStore) -> None:
    """Copy costs across machines join the devices' own (within a node) in ``transfers``."""
    from tbs.cluster.links import links

    by_group: dict[str, list[str]] = {}
    for device in store.meta.devices:
        by_group.setdefault(str(device["name"]).split("/", 1)[0], []).append(str(device["name"]))
    try:
        found = links(ray, groups, by_group)
    except Exception as exc:  # a node left between: the profile stands, a split across machines is refused
        store.update_metadata(cluster_links=f"not measured: {str(exc).strip().splitlines()[0][:200]}")
        return
    transfers = dict(store.meta.transfers)
    transfers.update(found)
    store.update_metadata(transfers=transfers, cluster_links="object store (ray.get of a remote buffer)")
