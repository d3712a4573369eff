"""Takes TPOT as the mean inter-chunk gap: wrong when a chunk carries several tokens, and None for one chunk."""
EXERCISE = "8.2"


def request_metrics(record):
    if not record.success or not record.chunk_times or record.end is None:
        raise ValueError(f"request {record.request_id!r} has no metrics")
    ttft = record.chunk_times[0] - record.start
    e2e = record.end - record.start
    itl = [b - a for a, b in zip(record.chunk_times, record.chunk_times[1:])]
    tpot = sum(itl) / len(itl) if itl else None
    return RequestMetrics(ttft, tpot, itl, e2e)
