"""The engine: sequences, the scheduler, the runner that builds a step's tensors, and the step loop."""
