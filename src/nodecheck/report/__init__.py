"""The typed Report and its sections, with their vocabulary (reason names, event codes, compute modes),
Measurement, PathSpec and Finding: the one object every face reads."""
