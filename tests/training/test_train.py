"""The model trains: a gradient flows through every layer (the bundled models, the heads and the
distilled draft are all trained by minillm itself, so an in-place op that breaks autograd is a bug)."""
import torch

from minillm.models.prepare import load_model
from minillm.models.registry import BUNDLED_DIR
from minillm.training.bundled import batch_loss


def test_a_training_step_reaches_every_parameter_and_lowers_the_loss():
    model = load_model(BUNDLED_DIR / "pico", torch.float32, torch.device("cpu"))
    model.train()
    rows = torch.randint(1, model.config.vocab_size, (3, 33), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = batch_loss(model, rows)
    before.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"no gradient for {name}"
    opt.step()
    with torch.no_grad():
        assert batch_loss(model, rows) < before
