"""tbs report: merging machines, pricing three ways, the HTML page in a real headless browser."""

import json
import shutil
import subprocess

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import FAST
from tbs.cli import cli


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def two_batch_profile(seq_pkl, tmp_path_factory):
    out = tmp_path_factory.mktemp("prof") / "p"
    result = run("profile", seq_pkl, "--out", out, "--batch", "2,16", "--cost", "cpu=0.5", *FAST)
    assert result.exit_code == 0, result.stderr
    return out


def _copy_as_host(src, dst, host):
    shutil.copytree(src, dst)
    meta = json.loads((dst / "metadata.json").read_text())
    meta["host"]["hostname"] = host
    (dst / "metadata.json").write_text(json.dumps(meta))
    return dst


def test_profile_writes_a_report(two_batch_profile):
    page = (two_batch_profile / "report.html").read_text()
    assert "Plotly" in page and "Summary" in page and "dense_1" in page


def test_prices_three_ways(two_batch_profile):
    base = pd.read_csv(two_batch_profile / "summary.csv")
    per_sample = base.set_index(["layer", "batch_size"])["per_sample_s"]
    for option, usd_per_hour in ((["--cost", "cpu=2/h"], 2.0),
                                 (["--cost", "cpu=capex:25000/1y"], 25000 / 8760),
                                 (["--cost", "cpu=4", "--spot", "cpu=0.7"], 4 * 0.3)):
        result = run("report", two_batch_profile, *option, "--format", "csv")
        assert result.exit_code == 0, result.stderr
        from io import StringIO

        priced = pd.read_csv(StringIO(result.output)).set_index(["layer", "batch_size"])
        assert priced["usd_per_hour"].iloc[0] == pytest.approx(usd_per_hour)
        expected = per_sample * usd_per_hour / 3600
        assert (priced["cost_per_sample_usd"] - expected).abs().max() < 1e-15


def test_price_file_records_source_and_date(two_batch_profile, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("cpu:\n  price: capex:25000/1y\n  source: thesis table 3\n  date: 2023-05-01\n")
    out = tmp_path / "r.html"
    result = run("report", two_batch_profile, "--prices", prices, "-o", out, "--samples", "1000000")
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    assert "thesis table 3" in page and "2023-05-01" in page and "cost of 1,000,000 samples" in page
    csv = tmp_path / "prices.csv"
    csv.write_text("device,price,source,date\ncpu,0.9,cloud list,2026-11-01\n")
    as_json = run("report", two_batch_profile, "--prices", csv, "--format", "json")
    assert json.loads(as_json.output)["prices_usd_per_hour"] == {"cpu": 0.9}


def test_merge_two_hosts_side_by_side(two_batch_profile, tmp_path):
    a = _copy_as_host(two_batch_profile, tmp_path / "a", "cpubox")
    b = _copy_as_host(two_batch_profile, tmp_path / "b", "gpubox")
    result = run("report", a, b, "--format", "json")
    assert result.exit_code == 0, result.stderr
    devices = {row["device"] for row in json.loads(result.output)["layers"]}
    assert devices == {"cpubox/cpu:0", "gpubox/cpu:0"}
    text = run("report", a, b)
    assert "cpubox/cpu:0" in text.output and "gpubox/cpu:0" in text.output
    priced = json.loads(run("report", a, b, "--cost", "cpu=1,gpubox/cpu:0=3", "--format", "json").output)
    by_device = {row["device"]: row["usd_per_hour"] for row in priced["layers"]}
    assert by_device == {"cpubox/cpu:0": 1.0, "gpubox/cpu:0": 3.0}


@pytest.mark.parametrize("args, fragment", [
    (["--cost", "cpu=abc"], "'abc'"),
    (["--cost", "cpu=capex:1/0y"], "capex"),
    (["--spot", "cpu=1.5"], "[0, 1)"),
    (["--prices", "{tmp}/missing.csv"], "does not exist"),
    (["--prices", "{tmp}/bad.csv"], "needs a device"),
])
def test_bad_prices_one_line_exit_2(args, fragment, two_batch_profile, tmp_path):
    (tmp_path / "bad.csv").write_text("device,price\nquantum,3\n")
    result = run("report", two_batch_profile, *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr


def test_profiles_of_different_models_are_refused(two_batch_profile, tmp_path):
    other = _copy_as_host(two_batch_profile, tmp_path / "other", "x")
    meta = json.loads((other / "metadata.json").read_text())
    meta["model"]["sha256"] = "different"
    meta["layers"] = [dict(l, name=l["name"] + "_x") for l in meta["layers"]]
    (other / "metadata.json").write_text(json.dumps(meta))
    result = run("report", two_batch_profile, other)
    assert result.exit_code == 2 and "one model only" in result.stderr
    missing = run("report", tmp_path / "nothing")
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="Chromium is not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium_without_network(two_batch_profile, tmp_path):
    # every host name resolves to nothing: the page must render from the file alone
    png, page = tmp_path / "report.png", (two_batch_profile / "report.html").as_uri()
    args = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'u'}",
            "--virtual-time-budget=10000", "--window-size=1280,3000", f"--screenshot={png}"]
    dom = subprocess.run([*args, "--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
    # plotly replaces each figure's div with a rendered plot; a JS error would leave none
    assert dom.count('class="plot-container plotly"') >= 5
    if not png.exists():  # an older headless Chromium does one of --dump-dom and --screenshot per run
        subprocess.run([*args, page], capture_output=True, timeout=120)
    assert png.stat().st_size > 20_000
