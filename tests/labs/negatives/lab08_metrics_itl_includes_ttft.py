"""Puts the TTFT in front of the inter-token latencies, as if the request's start were a chunk."""
EXERCISE = "8.2"


def request_metrics(record):
    if not record.success or not record.chunk_times or record.end is None:
        raise ValueError(f"request {record.request_id!r} has no metrics")
    ttft = record.chunk_times[0] - record.start
    e2e = record.end - record.start
    times = [record.start] + record.chunk_times
    itl = [b - a for a, b in zip(times, times[1:])]
    tpot = (e2e - ttft) / (record.output_tokens - 1) if record.output_tokens > 1 else None
    return RequestMetrics(ttft, tpot, itl, e2e)
