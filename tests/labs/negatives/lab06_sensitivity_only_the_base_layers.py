"""Sweeps only the layers the base picks (all when it picks none): a base with layers of its own gives fewer results."""
EXERCISE = "6.6"


def layer_sensitivity(model, reference, base):
    layers = base.layers if base.layers is not None else range(len(model.model.layers))
    return [reference.compare(quantize_model(copy.deepcopy(model), replace(base, layers=(i,)))) for i in layers]
