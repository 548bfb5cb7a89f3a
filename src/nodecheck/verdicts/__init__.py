"""Measurements judged against their specs, what NCCL did, error signals joined to the verdicts of their
paths, and a config checked against a node."""
