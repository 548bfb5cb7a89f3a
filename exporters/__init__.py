"""Faces that turn a Report into something else (Prometheus metrics, node_exporter textfiles).
The JSON form is Report.to_dict(); the Prometheus exporter lands with issue 4."""
