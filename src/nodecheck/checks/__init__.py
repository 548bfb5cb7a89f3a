"""Report + Config -> findings: one module per family of checks, run in order by checks/rules.py."""
