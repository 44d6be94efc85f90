"""backends/tensorflow"""
