"""Quantizes the model it is given, in place, instead of a copy."""
EXERCISE = "6.6"


def layer_sensitivity(model, reference, base):
    return [reference.compare(quantize_model(model, replace(base, layers=(i,))))
            for i in range(len(model.model.layers))]
