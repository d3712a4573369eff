"""Counts failed requests whose recorded times happen to meet the SLOs."""
EXERCISE = "8.3"


def goodput(records, duration, slo):
    if duration <= 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    for name in slo:
        if name not in SLO_METRICS:
            raise ValueError(f"unknown SLO {name!r}")
    good = 0
    for record in records:
        if record.chunk_times and record.end is not None:
            m = request_metrics(RequestRecord(record.request_id, record.start, record.chunk_times, record.end,
                                              record.prompt_tokens, record.output_tokens, True))
            good += all(getattr(m, k) is None or getattr(m, k) <= v for k, v in slo.items())
    return good / duration
