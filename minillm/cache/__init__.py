"""KV-cache layouts: contiguous per sequence (the baseline) and, later, paged blocks."""
