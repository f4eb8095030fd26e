"""Shipped configs (YAML only): this marker makes them package data, so the quickstart is the CLI default."""
