"""Quantizes each layer together with the layers the base already picks, instead of alone."""
EXERCISE = "6.6"


def layer_sensitivity(model, reference, base):
    picked = set(base.layers or ())
    return [reference.compare(quantize_model(copy.deepcopy(model), replace(base, layers=tuple(sorted(picked | {i})))))
            for i in range(len(model.model.layers))]
