"""Benchmarks: datasets, item types, loaders and metrics, one module per benchmark."""
