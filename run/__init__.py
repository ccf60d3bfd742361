"""The chip driver and its run tools: build the chip's simulation, LOAD an image, stream tokens, read the counters."""
