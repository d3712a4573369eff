"""KL(student || teacher): the divergence in the wrong direction (mode-seeking)."""
EXERCISE = "5.6"


def distill_loss(student_logits, teacher_logits, temperature=1.0):
    t = temperature
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    student = F.log_softmax(student_logits.float() / t, dim=-1)
    return (student.exp() * (student - teacher)).sum(-1).mean() * t * t
