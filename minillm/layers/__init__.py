"""Building blocks of a Llama-family decoder, one concept per file."""
