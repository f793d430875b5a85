"""Where a model keeps its residual blocks: ``find_layers(model)`` for depthlab and Hugging Face models.

    layers = find_layers(model)     # the nn.ModuleList of blocks, in order; DepthlabError when there is none
"""

from __future__ import annotations

from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.hf.families import family_of, family_of_model, get_path, known_family
from depthlab.hf.inferred import search_layers
from depthlab.hf.structure import no_layer_list
from depthlab.hf.wrappers import find_tower, tower_family, wrapper_of
from depthlab.models.decoder import SchemedModel


def find_layers(model: nn.Module, tower: str = "language") -> nn.ModuleList:
    """The ordered residual blocks of a depthlab ``DecoderLM`` or ``ViT``, or of a Hugging Face model: a decoder
    family's entry says where they sit (:mod:`depthlab.hf.families`), an image-text wrapper's entry where each of
    its towers does (:mod:`depthlab.hf.wrappers`; ``tower``: language or vision); other models are searched."""
    config = getattr(model, "config", None)
    if tower != "language" or (config is not None and wrapper_of(config) is not None):
        tower_family(config if config is not None else {}, tower)  # a vision tower of a text model: one line
        layers = find_tower(model, tower)
        if layers is None:
            raise DepthlabError(f"{type(model).__name__} holds no {tower} blocks at "
                                f"{tower_family(config, tower).layers}")
        return layers
    if isinstance(model, SchemedModel):
        return model.blocks
    model_type = getattr(config, "model_type", None)
    fam = known_family(model_type)
    if fam is None and model_type is not None and hasattr(model, "generate"):  # a causal LM outside the table
        fam = family_of_model(model)
        fam = None if fam.why_not("diagnose") else fam
    if fam is not None:
        layers = get_path(model, family_of(model_type, "diagnose").layers if not fam.inferred else fam.layers)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return layers
    layers = search_layers(model)
    if layers is None:
        raise DepthlabError(no_layer_list(type(model).__name__))
    return layers
