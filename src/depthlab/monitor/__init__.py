"""Depth tracking inside the loops people train with, and the trackers they read.

    from depthlab.monitor import DepthMonitor, DepthMonitorCallback
    monitor = DepthMonitor(model, probe_ids, every=100)        # any loop: monitor.step(step) -> scalars or None
    DepthMonitorCallback(probe_ids, every=100).attach(trainer) # a Hugging Face Trainer: logs via its reporters
    # Lightning: depthlab.monitor.lightning.DepthMonitorLightning(probe_ids, every=100) in callbacks=[...]

Per block and probe: output variance, angular distance, contribution, pre-norm gain and the Δloss of
removing it (:mod:`depthlab.diagnostics.tracking`, the functions depthlab's trainer calls), named
``depth/<quantity>/block_<l>`` (:mod:`depthlab.monitor.names`). :mod:`depthlab.monitor.trackers`
mirrors depthlab runs to TensorBoard, Weights & Biases and trackio.
"""

from depthlab._lazy import lazy_exports

__all__ = ["DepthMonitor", "DepthMonitorCallback", "DepthMonitorLightning", "TrackerSpec", "Trackers", "block_tag",
           "probe_scalars", "record_scalars", "resolve_layers"]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("DepthMonitor", "resolve_layers"), "depthlab.monitor.core"),
    "DepthMonitorCallback": "depthlab.monitor.hf",
    "DepthMonitorLightning": "depthlab.monitor.lightning",
    **dict.fromkeys(("TrackerSpec", "Trackers"), "depthlab.monitor.trackers"),
    **dict.fromkeys(("block_tag", "probe_scalars", "record_scalars"), "depthlab.monitor.names"),
})
