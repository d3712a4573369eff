"""The engine, in three parts: the input processor (a prompt -> a request), the core (schedule, run the
model, verify and sample, advance the sequences) and the output processor (tokens -> text, stops, outputs)."""
