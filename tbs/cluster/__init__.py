"""Profiling across a Ray cluster (optional extra: ``pip install 'tbs[ray]'``).

Only this package imports Ray. ``discovery`` reads the cluster's nodes and groups identical
ones, so one profiling task per group measures every kind of device the cluster offers.
"""
