"""The Prometheus face: the exposition of a Report, the exporter daemon and its HTTP server, node_exporter's
web config."""
