"""kl_div with reduction="mean": averages over the vocabulary as well as the tokens."""
EXERCISE = "5.6"


def distill_loss(student_logits, teacher_logits, temperature=1.0):
    t = temperature
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    student = F.log_softmax(student_logits.float() / t, dim=-1)
    return F.kl_div(student, teacher, log_target=True, reduction="mean") * t * t
