"""pytest fixtures for the broker (filled in by the testing work)."""
