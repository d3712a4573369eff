"""Takes the log of a softmax: a probability that underflows to 0 gives log 0 = -inf, and NaN or inf."""
EXERCISE = "5.6"


def distill_loss(student_logits, teacher_logits, temperature=1.0):
    t = temperature
    p = (teacher_logits.float() / t).softmax(-1)
    q = (student_logits.float() / t).softmax(-1)
    return (p * (p.log() - q.log())).sum(-1).mean() * t * t
