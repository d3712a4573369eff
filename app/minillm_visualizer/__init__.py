"""The visualizer's building blocks: the engine run in the background, the knobs, the charts."""
