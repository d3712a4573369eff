"""Refuses a failed request and one without chunk times, but not one without an end: E2E is None - start."""
EXERCISE = "8.2"


def request_metrics(record):
    if not record.success or not record.chunk_times:
        raise ValueError(f"request {record.request_id!r} has no metrics")
    ttft = record.chunk_times[0] - record.start
    e2e = record.end - record.start
    itl = [b - a for a, b in zip(record.chunk_times, record.chunk_times[1:])]
    tpot = (e2e - ttft) / (record.output_tokens - 1) if record.output_tokens > 1 else None
    return RequestMetrics(ttft, tpot, itl, e2e)
