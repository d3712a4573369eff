"""Checks `duration <= 0`, which is False for NaN: a NaN duration returns NaN instead of a ValueError."""
EXERCISE = "8.3"


def goodput(records, duration, slo):
    if duration <= 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    for name in slo:
        if name not in SLO_METRICS:
            raise ValueError(f"unknown SLO {name!r}")
    good = 0
    for record in records:
        if record.success:
            m = request_metrics(record)
            good += all(getattr(m, k) is None or getattr(m, k) <= v for k, v in slo.items())
    return good / duration
