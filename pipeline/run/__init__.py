"""Run planning: the driver's checks and plan, which pools run, routing, batch pieces and
spill slices, and the one-writer lease."""
