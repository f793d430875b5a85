"""Reading a model one decoder layer at a time (the *streamed* engine), for models larger than memory.

    target = open_streamed("path/to/hf-dir", dtype=torch.bfloat16)     # or a depthlab run directory
    sweeper = Sweeper(target, SweepSettings(state_dir=root))
    sweeper.sweep("diagnose", batches, [Lane("base"), *removal_lanes(L)], keep_states=True, consumer=c)

One file per idea, from the disk up:

    safetensors   the weight files: headers checked, tensors indexed by name, read on demand, counted (WeightMeter)
    source        LayerSource: a model on the meta device, one module materialised at a time; Call: how the
                  model's own forward calls each layer (recorded with stubs, nothing re-implemented)
    hf            HFLayerSource: transformers' own classes for an HF directory (the family registry says where
                  the blocks sit)
    run           RunLayerSource: a depthlab run's DecoderLM
    verify        the whole checkpoint checked before the first layer is read
    open          locate / open_streamed / StreamTarget: what the engine choice and the commands open
    lanes         Lane: a variant of the model carried through a sweep (blocks skipped, branches zeroed)
    sweep         Sweeper: every lane through each layer while it is loaded; results to a consumer
    resume        the resume state beside a command's output: one writer, saved after every layer

Words: *streamed* is the engine (the model read layer by layer; ``--stream``), a *lane* one variant carried
through a *sweep*, the *resume state* what a sweep saves to continue after a crash. Nothing here imports from
``depthlab.analysis``: the measures (diagnose, prune) are consumers of the sweep, above it.
"""

from depthlab.base.lazy import lazy_exports

__all__ = ["HFLayerSource", "Lane", "LayerSource", "Located", "RunLayerSource", "StreamTarget", "SweepBatch",
           "SweepSettings", "Sweeper", "Taps", "TensorStore", "WeightMeter", "locate", "open_streamed",
           "owned_state", "removal_lanes", "state_dir", "stored_bytes", "sublayer_lanes"]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("TensorStore", "WeightMeter"), "depthlab.targets.stream.safetensors"),
    "LayerSource": "depthlab.targets.stream.source",
    "HFLayerSource": "depthlab.targets.stream.hf",
    "RunLayerSource": "depthlab.targets.stream.run",
    **dict.fromkeys(("Located", "StreamTarget", "locate", "open_streamed", "stored_bytes"),
                    "depthlab.targets.stream.open"),
    **dict.fromkeys(("Lane", "removal_lanes", "sublayer_lanes"), "depthlab.targets.stream.lanes"),
    **dict.fromkeys(("SweepBatch", "SweepSettings", "Sweeper", "Taps"), "depthlab.targets.stream.sweep"),
    **dict.fromkeys(("owned_state", "state_dir"), "depthlab.targets.stream.resume"),
})
