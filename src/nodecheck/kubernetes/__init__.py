"""The Kubernetes face: node conditions, Events and the taint through the API server, and node-problem-detector's
custom-plugin protocol."""
