"""What a model is: configs, presets, the scheme registry, and the models built from them.

    config      SchemedConfig (depth, width, heads, scheme), ModelConfig (decoder), ViTConfig
    presets     every preset table (decoder and ViT shapes, training defaults per preset)
    schemes     THE registry: the one place a scheme name means something
    configure   from_preset / configure: a preset plus overrides, validated
    nn/         modules only (norms, attention, MLPs, blocks with named slots, hyper-connections, init rules)
    decoder     SchemedModel, DecoderLM, build_model
    vit/        the ViT classifier built from the same registry
    families    the model families (lm, vit): config type, presets, how to build one
"""
