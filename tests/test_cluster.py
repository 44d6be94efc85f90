"""A Ray cluster on this machine (ray.cluster_utils.Cluster, fake nodes told apart by custom resources).

One cluster for the module: the driver's head node (no CPUs for tasks), two identical
``twin_box`` nodes and one ``big`` node. The node-loss test runs last: it removes a twin.
Skipped where Ray is not installed (it is the optional extra tbs[ray]).
"""

from __future__ import annotations

import json
import pickle
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tbs[ray]')")

from ray.cluster_utils import Cluster  # noqa: E402

import tbs  # noqa: E402
from keras_models import keras, layers  # noqa: E402
from tbs.cli import cli  # noqa: E402
from tbs.cluster.discovery import connect, describe, node_groups  # noqa: E402

TIMING = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)
DEVICES = ["big/cpu:0", "twin_box/cpu:0"]


@pytest.fixture(scope="module")
def cluster():
    # The driver's node measures nothing. A killed node is declared dead after 3 failed health checks 0.5 s
    # apart (Ray's default: 5 checks 3 s apart, 15 s of the node-loss test); a slow but live node still has
    # Ray's 10 s to answer each check. No dashboard: nothing here reads it.
    settings = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    local = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                          "_system_config": settings})
    twins = [local.add_node(num_cpus=1, resources={"twin_box": 1}) for _ in range(2)]
    local.add_node(num_cpus=1, resources={"big_box": 1}, labels={"tbs/group": "big"})
    connect(local.address)
    local.twins = twins
    yield local
    ray.shutdown()
    local.shutdown()


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "m.pkl"
    inputs = keras.Input((8,), name="x")
    model = keras.Model(inputs, layers.Dense(2, name="out")(layers.Dense(4, name="hidden")(inputs)))
    with open(path, "wb") as f:
        pickle.dump(model, f)
    return path


def test_identical_nodes_form_one_group_and_each_group_says_what_it_offers(cluster):
    groups = {g.name: g for g in node_groups(ray) if g.cpus}
    assert set(groups) == {"twin_box", "big"}
    assert len(groups["twin_box"].nodes) == 2 and groups["twin_box"].cpus == 1
    assert groups["big"].labels == {"tbs/group": "big"} and groups["big"].resources == ["big_box"]
    assert all(g.cpu_model for g in groups.values())
    text = describe(list(groups.values()))
    assert "twin_box: 2 nodes, 1 CPUs" in text and "big: 1 node, 1 CPUs" in text


def test_tbs_devices_lists_the_node_groups(cluster):
    done = CliRunner().invoke(cli, ["devices", "--cluster", cluster.address])
    assert done.exit_code == 0, done.output
    assert "twin_box: 2 nodes" in done.output and "resources big_box" in done.output


def test_without_ray_the_option_says_how_to_install_it(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("no ray")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    done = CliRunner().invoke(cli, ["devices", "--cluster", "auto"])
    assert done.exit_code == 2 and "pip install 'tbs[ray]'" in done.output and "Traceback" not in done.output


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", [["devices"], ["profile", "m.pkl"]])
def test_an_address_where_nothing_listens_is_one_line_at_once_without_rays_log(command, tmp_path):
    """A real process (this one holds the test cluster): no 14 minutes of retries, no gcs_client lines."""
    import subprocess
    import sys

    model = tmp_path / "m.pkl"
    model.write_bytes(b"not checked before the address")
    args = [a if a != "m.pkl" else str(model) for a in command]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tbs", *args, "--cluster", "127.0.0.1:%d" % _free_port()],
                          capture_output=True, text=True, timeout=120)
    assert time.perf_counter() - started < 30
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot connect to a Ray cluster there (nothing listens there)" in done.stderr
    assert "gcs_client" not in done.stderr and "rpc_client" not in done.stderr


def test_an_address_that_listens_but_is_not_ray_gives_up_at_the_connect_timeout(monkeypatch):
    import socket

    from tbs.cluster import discovery

    monkeypatch.setattr(discovery, "CONNECT_TIMEOUT_S", 1.0)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = "127.0.0.1:%d" % server.getsockname()[1]
        discovery._reachable(address, "127.0.0.1", server.getsockname()[1])  # something listens: passes
        started = time.perf_counter()
        with pytest.raises(tbs.TbsError, match="did not answer as a Ray cluster within 1 s"):
            discovery._probe(address)
    assert time.perf_counter() - started < 10


def test_a_profile_across_the_cluster_holds_each_groups_devices_and_resumes(cluster, model_file, tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((4, 8), dtype=np.float32))  # it travels too
    seen: list[tuple[str, float | None]] = []
    p = tbs.profile(model_file, [4], devices="cpu:0", timing=TIMING, cluster=cluster.address, out=tmp_path / "p",
                    progress=lambda label, left: seen.append((label, left)), measure=tbs.MeasureConfig(analysis=False), input=tmp_path / "x.npy")
    assert p.complete and p.metadata["input_source"].endswith("x.npy")
    assert sorted(p.summary["device"].unique()) == DEVICES and sorted(p.model["device"]) == DEVICES
    assert len(p.summary) == 2 * 2 and set(p.summary["status"]) <= {"ok", "noisy"}
    assert {d["name"] for d in p.metadata["devices"]} == set(DEVICES)
    assert {"twin_box", "big"} <= {label.split(":")[0] for label, _ in seen}  # each group's progress, named
    ran_on = {e["group"]: e["node_id"] for e in p.metadata["environments"]}
    groups = {g.name: {n["node_id"] for n in g.nodes} for g in node_groups(ray)}
    assert ran_on["big"] in groups["big"] and ran_on["twin_box"] in groups["twin_box"]  # each on its own group
    written = pd.read_csv(tmp_path / "p" / "summary.csv")
    assert len(written) == 4 and (tmp_path / "p" / "report.html").is_file()
    assert all(d in tbs.render(p, "text") for d in DEVICES)
    link = p.metadata["transfers"]["twin_box/cpu:0->big/cpu:0"]  # timed through the object store
    assert link["alpha_s"] >= 0 and link["beta_s_per_byte"] >= 0
    assert tbs.recommend(p, "time").placement["device"].isin(DEVICES).all()

    # Interrupted after big's cells: --resume measures only twin_box's
    kept = written[written["device"] == "big/cpu:0"]
    kept.to_csv(tmp_path / "p" / "summary.csv", index=False)
    model_rows = pd.read_csv(tmp_path / "p" / "model.csv")
    model_rows[model_rows["device"] == "big/cpu:0"].to_csv(tmp_path / "p" / "model.csv", index=False)
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    (tmp_path / "p" / "metadata.json").write_text(json.dumps(dict(meta, status="interrupted")))
    again = tbs.profile(model_file, [4], devices="cpu:0", timing=TIMING, cluster=cluster.address, out=tmp_path / "p",
                        progress=None, measure=tbs.MeasureConfig(analysis=False), input=tmp_path / "x.npy", resume=True)
    assert again.complete and len(again.summary) == 4
    pd.testing.assert_frame_equal(
        again.summary[again.summary["device"] == "big/cpu:0"][["layer", "median_s"]].reset_index(drop=True),
        kept[["layer", "median_s"]].reset_index(drop=True))  # not measured again


def test_a_node_that_dies_mid_run_loses_no_finished_cell_and_its_twin_finishes(cluster, model_file, tmp_path):
    first = next(g for g in node_groups(ray) if g.name == "twin_box").nodes[0]["node_id"]
    victim = next(n for n in cluster.twins if n.node_id == first)
    summary = tmp_path / "p" / "summary.csv"
    killed: list[int] = []

    def twin_rows() -> int:
        try:  # read while the profile writes it: empty or cut mid-row for an instant
            return int((pd.read_csv(summary)["device"] == "twin_box/cpu:0").sum())
        except (FileNotFoundError, pd.errors.EmptyDataError, pd.errors.ParserError, KeyError):
            return 0

    def kill_after_two_cells() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and twin_rows() < 2:
            time.sleep(0.05)
        killed.append(twin_rows())
        cluster.remove_node(victim, allow_graceful=False)

    killer = threading.Thread(target=kill_after_two_cells)
    killer.start()
    batches = [2, 4, 8, 16]
    timing = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.1, min_block_seconds=0.002, min_span_seconds=0.25)
    p = tbs.profile(model_file, batches, devices="cpu:0", timing=timing, cluster=cluster.address, out=tmp_path / "p",
                    progress=None, measure=tbs.MeasureConfig(analysis=False))
    killer.join()
    assert p.complete
    twin = p.summary[p.summary["device"] == "twin_box/cpu:0"]
    cells = twin.groupby(["layer", "batch_size"]).size()
    assert len(cells) == 2 * len(batches) and (cells == 1).all()  # every cell once: none lost, none twice
    assert killed and 2 <= killed[0] < 2 * len(batches)  # it died mid-run
    retry = p.metadata["retries"][0]
    assert retry["group"] == "twin_box" and retry["cells_kept"] >= killed[0]
