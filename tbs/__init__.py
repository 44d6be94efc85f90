"""tbs: per-layer heterogeneous hardware profiler for Keras models.

    import tbs
    p = tbs.profile("models/cnn_flowers.pkl", batch_sizes=[32, 512], prices={"cpu": 0.5, "gpu": 3})
    rec = tbs.recommend(p, objective="cost")
    html = tbs.render(p, "html", recommendation=rec)

Importing tbs imports no framework: TensorFlow or JAX loads when a call needs it,
on the backend that call asks for.
"""

from tbs.api import cluster_groups, devices, diff, load, predict, profile, recommend, render, verify
from tbs.compare import Diff
from tbs.errors import TbsError, TbsWarning
from tbs.measure.config import MeasureConfig, TrainingConfig
from tbs.measure.timing import TimingConfig
from tbs.place.result import Recommendation
from tbs.place.verify import Verification
from tbs.profiles.profile import Profile

def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("tbs")  # one source: pyproject.toml
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown"


__version__ = _version()

__all__ = [
    "profile", "load", "recommend", "verify", "render", "devices", "predict", "diff", "cluster_groups",
    "Profile", "Diff", "Recommendation", "Verification", "TimingConfig", "MeasureConfig", "TrainingConfig", "TbsError", "TbsWarning", "__version__",
]
