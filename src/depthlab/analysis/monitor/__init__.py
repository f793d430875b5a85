"""Depth tracking inside the loops people train with, and the trackers they read.

    from depthlab.analysis.monitor import DepthMonitor, DepthMonitorCallback
    monitor = DepthMonitor(model, probe_ids, every=100)        # any loop: monitor.step(step) -> scalars or None
    DepthMonitorCallback(probe_ids, every=100).attach(trainer) # a Hugging Face Trainer: logs via its reporters
    # Lightning: depthlab.analysis.monitor.lightning.DepthMonitorLightning(probe_ids, every=100) in callbacks=[...]

Per block and probe: output variance, angular distance, contribution, pre-norm gain and the Δloss of
removing it (:mod:`depthlab.analysis.diagnostics.probes`, the functions depthlab's trainer calls), named
``depth/<quantity>/block_<l>`` (:mod:`depthlab.analysis.monitor.names`). :mod:`depthlab.analysis.monitor.trackers`
mirrors depthlab runs to TensorBoard, Weights & Biases and trackio.
"""

from depthlab.base.lazy import lazy_exports

__all__ = ["DepthMonitor", "DepthMonitorCallback", "DepthMonitorLightning", "TrackerSpec", "Trackers", "block_tag",
           "probe_scalars", "record_scalars", "resolve_layers"]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("DepthMonitor", "resolve_layers"), "depthlab.analysis.monitor.core"),
    "DepthMonitorCallback": "depthlab.analysis.monitor.hf",
    "DepthMonitorLightning": "depthlab.analysis.monitor.lightning",
    **dict.fromkeys(("TrackerSpec", "Trackers"), "depthlab.analysis.monitor.trackers"),
    **dict.fromkeys(("block_tag", "probe_scalars", "record_scalars"), "depthlab.analysis.monitor.names"),
})
