"""Embedded NSQ for tests and demos."""
