import pytest

from tbs.cost.prices import load_price_file, parse_prices
from tbs.cost.reprice import lookup
from tbs.cost.reprice import cost_per_sample_usd
from tbs.errors import TbsError


def test_parse_prices_kinds_and_devices():
    assert parse_prices("cpu=0.5,gpu=3") == {"cpu": 0.5, "gpu": 3.0}
    assert parse_prices(" GPU:1 = 2.5/h , tpu=8") == {"gpu:1": 2.5, "tpu": 8.0}


@pytest.mark.parametrize("text, fragment", [
    ("gpu=-1", "-1"), ("gpu=abc", "'abc'"), ("gpu", "KIND=USD_PER_HOUR"), ("quantum=3", "'quantum'"),
    ("gpu=inf", "finite"), ("", "no price"),
])
def test_bad_prices_name_the_value(text, fragment):
    with pytest.raises(TbsError, match="--cost") as info:
        parse_prices(text)
    assert fragment in str(info.value)


def test_price_lookup_prefers_the_exact_device():
    prices = {"gpu": 3.0, "gpu:1": 2.0}
    assert lookup(prices, "gpu:1", "gpu") == 2.0
    assert lookup(prices, "gpu:0", "gpu") == 3.0
    assert lookup(prices, "cpu:0", "cpu") is None


def test_cost_per_sample_arithmetic_and_unknowns():
    # 2 ms per sample at $3/h = 3 * 0.002 / 3600 dollars
    assert cost_per_sample_usd(0.002, 3.0) == pytest.approx(1.6666666e-6)
    assert cost_per_sample_usd(0.002, None) is None  # no price is unknown, never 0
    assert cost_per_sample_usd(None, 3.0) is None
    assert cost_per_sample_usd(0.002, 0.0) == 0.0  # an explicit $0 (e.g. a host CPU) stays 0


def test_capex_is_amortised_over_hours_of_the_years():
    # the thesis: $25,000 over one year = $2.85/h
    assert parse_prices("cpu=capex:25000/1y")["cpu"] == pytest.approx(25000 / 8760)
    assert parse_prices("cpu=capex:25000/1y")["cpu"] == pytest.approx(2.85, abs=0.01)
    assert parse_prices("gpu=capex:30000/18m")["gpu"] == pytest.approx(30000 / (1.5 * 8760))
    for bad in ("cpu=capex:abc/1y", "cpu=capex:25000", "cpu=capex:25000/0y", "cpu=capex:-5/1y"):
        with pytest.raises(TbsError, match="capex:USD/YEARSy"):
            parse_prices(bad)


def test_bad_price_in_a_csv_file_names_the_file_and_line(tmp_path):
    path = tmp_path / "prices.csv"
    path.write_text("device,price,source,date\ncpu,0.5,list,2024-01\ngpu,abc,list,2024-01\n")
    with pytest.raises(TbsError) as info:
        load_price_file(str(path))
    message = str(info.value)
    assert message.startswith(f"--prices {path} line 3: price 'abc' for gpu is not a number")
    assert "--cost" not in message and "\n" not in message


def test_bad_capex_in_a_yaml_file_names_the_line_of_its_key(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text("cpu: 0.5\n# the accelerator\ngpu:\n  price: capex:lots/1y\n  source: quote\n")
    with pytest.raises(TbsError) as info:
        load_price_file(str(path))
    assert str(info.value).startswith(f"--prices {path} line 3: 'capex:lots/1y' for gpu")
    assert "--cost" not in str(info.value)


def test_price_file_entry_without_a_device_names_its_line(tmp_path):
    path = tmp_path / "prices.csv"
    path.write_text("device,price\ngpu,3\nquantum,2\n")
    with pytest.raises(TbsError, match=r"line 3: each entry needs a device"):
        load_price_file(str(path))


def test_good_price_files_still_load(tmp_path):
    csv_path, yaml_path = tmp_path / "p.csv", tmp_path / "p.yml"
    csv_path.write_text("device,price,source,date\ngpu:1,2.5/h,vendor,2024-05\ncpu,capex:8760/1y,,\n")
    yaml_path.write_text("gpu: 3\ntpu:\n  price: 8\n  source: cloud\n")
    prices, sources = load_price_file(str(csv_path))
    assert prices == {"gpu:1": 2.5, "cpu": pytest.approx(1.0)} and sources["gpu:1"]["source"] == "vendor"
    prices, sources = load_price_file(str(yaml_path))
    assert prices == {"gpu": 3.0, "tpu": 8.0} and sources["tpu"]["source"] == "cloud"
