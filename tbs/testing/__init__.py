"""Fakes for testing tbs and code built on it, without TensorFlow, JAX or Keras.

``fakes``: scripted devices on a fake clock that run the real profiler (``FakeDevice``,
``FakeModel``, ``fake_profile``); ``training``: fake training profiles written through
the real store (``fake_training_profile``). Both are importable from here.
"""

from tbs.testing.fakes import (FAKE_TIMING, HARNESS, INPUT_WIDTH, FakeClock, FakeDevice, FakeLayer, FakeModel,
                               RecordingProgress, RunEvent, Tracer, chain, fake_capture, fake_metadata, fake_profile,
                               fake_rebuild, fake_request, fake_tensors)
from tbs.testing.training import fake_training_profile, training_model

__all__ = ["FAKE_TIMING", "HARNESS", "INPUT_WIDTH", "FakeClock", "FakeDevice", "FakeLayer", "FakeModel",
           "RecordingProgress", "RunEvent", "Tracer", "chain", "fake_capture", "fake_metadata", "fake_profile",
           "fake_rebuild", "fake_request", "fake_tensors", "fake_training_profile", "training_model"]
