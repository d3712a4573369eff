"""Quantizes layers 0..i for result i (a growing set), not layer i alone."""
EXERCISE = "6.6"


def layer_sensitivity(model, reference, base):
    return [reference.compare(quantize_model(copy.deepcopy(model), replace(base, layers=tuple(range(i + 1)))))
            for i in range(len(model.model.layers))]
