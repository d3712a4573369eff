"""Checks the SLO names only while judging a successful record: with no records, or only failed ones, an
unknown metric name goes unnoticed."""
EXERCISE = "8.3"


def goodput(records, duration, slo):
    if not duration > 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    good = 0
    for record in records:
        if not record.success:
            continue
        m = request_metrics(record)
        met = True
        for name, limit in slo.items():
            if name not in SLO_METRICS:
                raise ValueError(f"unknown SLO {name!r}")
            value = getattr(m, name)
            met = met and (value is None or value <= limit)
        good += met
    return good / duration
