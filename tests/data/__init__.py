"""Tests of lit_prunedpo.data (a package, so its conftest and helpers do not collide with other test folders)."""
