"""Builds a new QuantConfig from base's scheme and projections, and so drops its group size."""
EXERCISE = "6.6"


def layer_sensitivity(model, reference, base):
    return [reference.compare(quantize_model(copy.deepcopy(model),
                                             QuantConfig(base.scheme, layers=(i,), projections=base.projections)))
            for i in range(len(model.model.layers))]
