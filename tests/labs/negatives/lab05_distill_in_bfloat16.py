"""Computes the loss in the logits' own dtype: right in float32, but bfloat16 logits give a bfloat16 loss, about
1e-2 of itself off (issue 53)."""
EXERCISE = "5.6"


def distill_loss(student_logits, teacher_logits, temperature=1.0):
    t = temperature
    teacher = F.log_softmax(teacher_logits / t, dim=-1)
    student = F.log_softmax(student_logits / t, dim=-1)
    return (teacher.exp() * (teacher - student)).sum(-1).mean() * t * t
