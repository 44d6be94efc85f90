"""The profile's metadata and layer records are declared once, in tbs.schema, and enforced on every write."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from tbs.capture.recorder import LayerCall
from tbs.cluster.driver import PER_GROUP
from tbs.profiles.profile import load_profile
from tbs.profiles.store import ProfileStore
from tbs.schema import MEASUREMENT_SETTINGS, METADATA_KEYS, LayerRecord, Metadata, check_declared


def test_a_key_no_field_declares_is_refused_before_it_reaches_the_file(tmp_path):
    store = ProfileStore(tmp_path / "p")
    store.create({"mode": "inference"})
    with pytest.raises(TypeError, match="'modle'.*not declared in tbs.schema.Metadata"):
        store.update_metadata(modle={"name": "typo"})
    assert "modle" not in json.loads((tmp_path / "p" / "metadata.json").read_text())
    check_declared({"mode": "training", "capacity": {}})  # declared keys pass


def test_keys_other_modules_name_by_string_are_declared():
    assert set(MEASUREMENT_SETTINGS) <= set(METADATA_KEYS)
    assert set(PER_GROUP) <= set(METADATA_KEYS)


def test_every_key_a_real_profile_writes_is_declared_and_reads_back_typed(two_device_profile):
    written = json.loads((two_device_profile / "metadata.json").read_text())
    assert set(written) <= set(METADATA_KEYS)
    profile = load_profile(two_device_profile)
    assert profile.meta.mode == written["mode"] and profile.meta.devices == written["devices"]
    assert [r.name for r in profile.layers] == ["dense", "dense_1"]
    assert profile.meta.recorded("predicted_devices") is None  # not in the file: None, not an empty list
    assert profile.meta.predicted_devices == []


def test_unknown_keys_from_a_newer_writer_are_ignored_on_read():
    meta = Metadata.from_dict({"mode": "inference", "from_the_future": 1, "capacity": None})
    assert meta.mode == "inference" and meta.capacity == {} and meta.recorded("capacity") is None


def test_a_captured_call_is_a_layer_record_and_saves_only_the_record():
    call = LayerCall(name="d", type="Dense", category="dense", params=12, input_shapes=[[None, 3]],
                     output_shapes=[[None, 4]], input_bytes=12, output_bytes=16, op=object(), args=(1,),
                     eager_seconds=0.1, sources=["/input/x"])
    assert isinstance(call, LayerRecord)
    saved = call.replace(batch_size=8).as_dict()
    assert set(saved) <= {f.name for f in fields(LayerRecord)} and saved["batch_size"] == 8
    assert "trainable" not in saved  # None: not applicable, left out of the file
    assert LayerRecord.from_dict(dict(saved, added_later=True)) == call.replace(batch_size=8)
