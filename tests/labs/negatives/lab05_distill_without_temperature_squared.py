"""Softens both distributions but forgets to multiply the loss by temperature^2."""
EXERCISE = "5.6"


def distill_loss(student_logits, teacher_logits, temperature=1.0):
    t = temperature
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    student = F.log_softmax(student_logits.float() / t, dim=-1)
    return (teacher.exp() * (teacher - student)).sum(-1).mean()
