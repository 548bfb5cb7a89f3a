"""nodecheck: what a GPU node is, whether it performs to spec, and whether a job can start on it."""

__version__ = "0.1.0"
