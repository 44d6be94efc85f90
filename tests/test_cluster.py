"""A Ray cluster on this machine (ray.cluster_utils.Cluster, fake nodes told apart by custom resources).

Skipped where Ray is not installed (it is the optional extra tbs[ray]).
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tbs[ray]')")

from ray.cluster_utils import Cluster  # noqa: E402

from tbs.cli import cli  # noqa: E402
from tbs.cluster.discovery import connect, describe, node_groups  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    local = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    local.add_node(num_cpus=1, resources={"cpu_box": 1})
    local.add_node(num_cpus=1, resources={"cpu_box": 1})  # identical: the same group
    local.add_node(num_cpus=2, resources={"big_box": 1}, labels={"tbs/group": "big"})
    connect(local.address)
    yield local
    ray.shutdown()
    local.shutdown()


def test_identical_nodes_form_one_group_and_each_group_says_what_it_offers(cluster):
    groups = {g.name: g for g in node_groups(ray)}
    assert set(groups) >= {"cpu_box", "big"} and len(groups) == 3  # the head node is a group of its own
    assert len(groups["cpu_box"].nodes) == 2 and groups["cpu_box"].cpus == 1
    assert groups["big"].cpus == 2 and groups["big"].labels == {"tbs/group": "big"}
    assert all(g.cpu_model for g in groups.values())
    text = describe(list(groups.values()))
    assert "cpu_box: 2 nodes, 1 CPUs" in text and "big: 1 node, 2 CPUs" in text


def test_tbs_devices_lists_the_node_groups(cluster):
    done = CliRunner().invoke(cli, ["devices", "--cluster", cluster.address])
    assert done.exit_code == 0, done.output
    assert "cpu_box: 2 nodes" in done.output and "resources big_box" in done.output


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


def test_a_profile_across_the_cluster_holds_each_groups_devices(tmp_path):
    import pickle

    import pandas as pd

    import tbs
    from conftest import keras, layers

    local = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # the driver's node measures nothing
    local.add_node(num_cpus=1, resources={"small_box": 1})
    local.add_node(num_cpus=1, resources={"other_box": 1})
    try:
        inputs = keras.Input((8,), name="x")
        model = keras.Model(inputs, layers.Dense(2, name="out")(layers.Dense(4, name="hidden")(inputs)))
        with open(tmp_path / "m.pkl", "wb") as f:
            pickle.dump(model, f)
        timing = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001,
                                  min_span_seconds=0.0)
        import numpy as np

        np.save(tmp_path / "x.npy", np.random.default_rng(0).random((4, 8), dtype=np.float32))  # it travels too
        ray.shutdown()
        seen: list[tuple[str, float | None]] = []
        p = tbs.profile(tmp_path / "m.pkl", [4], devices="cpu:0", timing=timing, cluster=local.address,
                        out=tmp_path / "p", progress=lambda label, left: seen.append((label, left)),
                        analysis=False, input=tmp_path / "x.npy")
        said = {label.split(":")[0] for label, _ in seen}
        assert {"small_box", "other_box"} <= said  # each group's progress, named
        assert any(left is not None and "box:" in label for label, left in seen)
        assert p.metadata["input_source"].endswith("x.npy")
        assert p.complete
        assert sorted(p.summary["device"].unique()) == ["other_box/cpu:0", "small_box/cpu:0"]
        assert len(p.summary) == 2 * 2 and set(p.summary["status"]) <= {"ok", "noisy"}
        assert sorted(p.model["device"]) == ["other_box/cpu:0", "small_box/cpu:0"]
        assert {d["name"] for d in p.metadata["devices"]} == {"other_box/cpu:0", "small_box/cpu:0"}
        written = pd.read_csv(tmp_path / "p" / "summary.csv")
        assert len(written) == 4 and (tmp_path / "p" / "report.html").is_file()
        assert "small_box/cpu:0" in tbs.render(p, "text") and "other_box/cpu:0" in tbs.render(p, "text")
        link = p.metadata["transfers"]["small_box/cpu:0->other_box/cpu:0"]  # timed through the object store
        assert link["alpha_s"] >= 0 and link["beta_s_per_byte"] >= 0
        assert tbs.recommend(p, "time").placement["device"].isin(["small_box/cpu:0", "other_box/cpu:0"]).all()
        # Interrupted after small_box's cells: --resume measures only other_box's
        import json

        kept = written[written["device"] == "small_box/cpu:0"]
        kept.to_csv(tmp_path / "p" / "summary.csv", index=False)
        model_rows = pd.read_csv(tmp_path / "p" / "model.csv")
        model_rows[model_rows["device"] == "small_box/cpu:0"].to_csv(tmp_path / "p" / "model.csv", index=False)
        meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
        (tmp_path / "p" / "metadata.json").write_text(json.dumps(dict(meta, status="interrupted")))
        again = tbs.profile(tmp_path / "m.pkl", [4], devices="cpu:0", timing=timing, cluster=local.address,
                            out=tmp_path / "p", progress=None, analysis=False, input=tmp_path / "x.npy", resume=True)
        assert again.complete and len(again.summary) == 4
        pd.testing.assert_frame_equal(
            again.summary[again.summary["device"] == "small_box/cpu:0"][["layer", "median_s"]].reset_index(drop=True),
            kept[["layer", "median_s"]].reset_index(drop=True))  # not measured again
    finally:
        ray.shutdown()
        local.shutdown()


def test_a_node_that_dies_mid_run_loses_no_finished_cell_and_its_twin_finishes(tmp_path):
    import pickle
    import threading
    import time

    import pandas as pd

    import tbs
    from conftest import keras, layers

    local = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    twins = [local.add_node(num_cpus=1, resources={"twin_box": 1}) for _ in range(2)]
    try:
        inputs = keras.Input((64,), name="x")
        hidden = layers.Dense(64, name="a")(layers.Dense(64, name="b")(inputs))
        with open(tmp_path / "m.pkl", "wb") as f:
            pickle.dump(keras.Model(inputs, layers.Dense(2, name="out")(hidden)), f)
        ray.shutdown()
        connect(local.address)
        first = next(g for g in node_groups(ray) if g.name == "twin_box").nodes[0]["node_id"]
        victim = next(n for n in twins if n.node_id == first)
        summary = tmp_path / "p" / "summary.csv"

        def kill_after_two_cells() -> None:
            deadline = time.time() + 120
            while time.time() < deadline and (not summary.exists() or len(summary.read_text().splitlines()) < 3):
                time.sleep(0.05)
            killed.append(len(summary.read_text().splitlines()) - 1 if summary.exists() else 0)
            local.remove_node(victim, allow_graceful=False)

        killed: list[int] = []
        killer = threading.Thread(target=kill_after_two_cells)
        killer.start()
        batches = [2, 4, 8, 16, 32, 64, 128, 256]
        timing = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.1, min_block_seconds=0.002,
                                  min_span_seconds=0.3)
        p = tbs.profile(tmp_path / "m.pkl", batches, devices="cpu:0", timing=timing, cluster=local.address,
                        out=tmp_path / "p", progress=None, analysis=False)
        killer.join()
        assert p.complete
        cells = p.summary.groupby(["layer", "batch_size"]).size()
        assert len(cells) == 3 * len(batches) and (cells == 1).all()  # every cell once: none lost, none twice
        assert set(p.summary["device"]) == {"twin_box/cpu:0"}
        assert len(pd.read_csv(summary)) == 3 * len(batches)
        assert killed and 2 <= killed[0] < 3 * len(batches)  # it died mid-run
        retry = p.metadata["retries"][0]
        assert retry["group"] == "twin_box" and retry["cells_kept"] >= killed[0]
    finally:
        ray.shutdown()
        local.shutdown()
