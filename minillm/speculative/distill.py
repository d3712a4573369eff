"""Distilling a draft toward its target: train the small model on the big one's distributions.

A draft is useful exactly as far as its proposals survive verification, and the acceptance rate
is sum_x min(p(x), q(x)) = 1 - TV(p, q): the closer q is to the target's p, the more survives.
So instead of the corpus's next token (one-hot), the draft learns the target's whole next-token
distribution, minimising KL(p || q) (Hinton et al. 2015; DistillSpec, Zhou et al. 2024).
"""
import torch
import torch.nn.functional as F


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher || student) per token, averaged: [..., vocab] logits of each -> a scalar.
    Both are softened by the temperature; the gradient is scaled by temperature^2, as usual, so
    that its size does not depend on it."""
    t = temperature
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    student = F.log_softmax(student_logits.float() / t, dim=-1)
    kl = (teacher.exp() * (teacher - student)).sum(-1)  # [...]
    return kl.mean() * t * t
