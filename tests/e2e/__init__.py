"""End-to-end tests against a real Kubernetes API server (a package, so its conftest is `e2e.conftest`
and never shadows tests/conftest.py as the module `conftest`)."""
