"""backends/jax"""
