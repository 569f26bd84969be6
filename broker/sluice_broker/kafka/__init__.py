"""Kafka listener."""
