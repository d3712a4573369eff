"""Returns the loss as a Python number (.item()): the right value, but nothing to train with."""
EXERCISE = "5.6"


def distill_loss(student_logits, teacher_logits, temperature=1.0):
    t = temperature
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    student = F.log_softmax(student_logits.float() / t, dim=-1)
    return ((teacher.exp() * (teacher - student)).sum(-1).mean() * t * t).item()
