"""Peers measured beside our engine, built reproducibly from their published sources."""
