"""Faces that publish a Report to Prometheus: the exposition (prometheus.py) shared by /metrics and the
node_exporter textfile, the scrape server (http.py, serve.py) and its TLS and basic auth (webconfig.py)."""
